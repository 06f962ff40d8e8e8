"""reaper: garbage-collects CI cloud resources that no live owner tracks any more.

Layout: ``config`` (validated settings), ``model`` (resources, evidence, plan),
``policy`` (the pure decision function), ``exports`` (decoders for gcloud and
kubectl exports and evidence files), ``cli`` (``reaper evaluate``).
"""

"""reaper: garbage-collects CI cloud resources that no live owner tracks any more.

Layout: ``config`` (validated settings), ``model`` (resources, evidence, plan),
``policy`` (the pure decision function), ``decoders`` (gcloud and
kubectl exports and evidence files), ``cli`` (``reaper evaluate``, ``check``, ``alert-rules``,
``metrics-retire``).
"""

# The project's version (pyproject.toml; a test keeps the two equal). Here, not read from the installed
# package's metadata: an Airflow image copies plugins/ and never installs the project.
__version__ = "0.1.0"

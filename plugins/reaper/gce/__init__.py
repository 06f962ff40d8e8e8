"""The GCE target's I/O: Compute clients, inventory listing, the deletion executor and writer health.

Everything here talks to the real ``google-cloud-compute`` client over REST (or
plain HTTP to Prometheus); the decisions themselves are in ``reaper.policy``.
"""

"""The Kubernetes target's I/O: API clients, inventory listing and the grouped deletion executor."""

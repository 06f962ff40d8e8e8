"""A sweep as Airflow runs it: the per-target I/O bundles (``targets``) and the DAG factory (``factory``)."""

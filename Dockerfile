# Astronomer-style image: the official Airflow 3.3.2 image plus this project's requirements,
# DAGs, plugins and include files. Runs as the image's non-root "airflow" user.
FROM apache/airflow:3.3.2-python3.11

USER airflow
COPY --chown=airflow:root requirements.txt /opt/airflow/requirements.txt
RUN pip install --no-cache-dir -r /opt/airflow/requirements.txt

COPY --chown=airflow:root dags/ /opt/airflow/dags/
COPY --chown=airflow:root plugins/ /opt/airflow/plugins/
COPY --chown=airflow:root include/ /opt/airflow/include/

ENV REAPER_CONFIG=/opt/airflow/include/reaper.yaml

"""Training code used by the example DAGs in dags/ (as Airflow providers ship their example code)."""

"""Code shared by the example DAGs (ignored by the DAG processor through .airflowignore)."""

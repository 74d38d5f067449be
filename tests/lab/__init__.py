"""stallscope fault-injection lab (see README.md)."""

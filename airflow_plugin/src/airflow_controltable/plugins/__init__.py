"""Airflow plugins shipped with the provider (declared in ``get_provider_info``'s ``plugins`` list)."""

"""Alembic migrations of the run store (run on open by ``workbench.runs.migrate``; see ``env.py``)."""

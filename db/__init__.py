"""Run store: SQLAlchemy models, Alembic migrations, queries. Never imports ``app``."""

"""PostgreSQL for integration tests: a schema of the test's own on LLM_SLO_POSTGRES_URL."""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator

from tests.conftest import require_or_skip


def schema_url(base_url: str, schema: str) -> str:
    """The URL whose search_path puts `schema` first (our table is named without one)."""
    separator = "&" if "?" in base_url else "?"
    return f"{base_url}{separator}options=-csearch_path%3D{schema}"


@contextlib.contextmanager
def postgres_schema(prefix: str) -> Iterator[str]:
    """A store URL on LLM_SLO_POSTGRES_URL whose records go to a fresh schema, dropped after.

    The shared database holds other tests' (and benchmarks') rows: a schema of our own, set as
    the connection's search_path, keeps them apart without truncating anyone's table.
    """
    url = os.environ.get("LLM_SLO_POSTGRES_URL")
    if not url:
        require_or_skip("no PostgreSQL: set LLM_SLO_POSTGRES_URL (.ci/run starts one)")
    try:
        import psycopg  # noqa: F401
    except ImportError:
        require_or_skip("psycopg is not installed (pip install 'llm-slo[postgres]')")
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import SQLAlchemyError

    schema = f"{prefix}_{uuid.uuid4().hex[:12]}"
    engine = create_engine(url)
    try:
        with engine.begin() as connection:
            connection.execute(text(f"CREATE SCHEMA {schema}"))
    except SQLAlchemyError as error:
        engine.dispose()
        require_or_skip(f"PostgreSQL at {url} is not reachable: {str(error).splitlines()[0]}")
    try:
        yield schema_url(url, schema)
    finally:
        with engine.begin() as connection:
            connection.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()

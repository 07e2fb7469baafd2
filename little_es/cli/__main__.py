"""``python -m little_es.cli``: the ``little`` command."""

from little_es.cli import app

app()

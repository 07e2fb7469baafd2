"""Optional integrations, each behind its own extra.

* :mod:`little_es.contrib.openai` - :class:`~little_es.contrib.openai.OpenAIChatModel`,
  a model over any OpenAI-compatible chat-completions API
  (``pip install 'little-es[openai]'``).

Importing a module here without its extra raises an ``ImportError`` that says
what to install; nothing in the core imports this package.
"""

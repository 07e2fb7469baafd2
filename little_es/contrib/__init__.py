"""Optional integrations, each behind its own extra.

* :mod:`little_es.contrib.openai` - :class:`~little_es.contrib.openai.OpenAIChatModel`,
  a model over any OpenAI-compatible chat-completions API
  (``pip install 'little-es[openai]'``).
* :mod:`little_es.contrib.anthropic` - :class:`~little_es.contrib.anthropic.AnthropicModel`,
  Claude over Anthropic's Messages API through the official client
  (``pip install 'little-es[anthropic]'``).
* :mod:`little_es.contrib.pydantic_ai` - a Pydantic AI agent as an agent step
  (``pip install 'little-es[pydantic-ai]'``).

Importing a module here without its extra raises an ``ImportError`` that says
what to install; nothing in the core imports this package.
"""

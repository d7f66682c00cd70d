"""The request bodies of the OpenAI routes, one module per route family, checked for shape,
type and range before any handler runs: :mod:`.generation` (what chat and completions
share, and completions), :mod:`.chat`, :mod:`.embeddings`, :mod:`.audio` (a multipart
form, read by hand), :mod:`.videos` (a multipart form or JSON, read by hand; the remix
body), and :mod:`.unicode` (no lone surrogates anywhere in a JSON body).
"""

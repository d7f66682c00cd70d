"""OpenAI's request and response shapes to and from the services' protos. Pure functions,
no I/O: what each field asks of a backend, and how a backend's reply is shown.

Generation (chat and completions): :mod:`.generation_request` (body -> ``GenerateRequest``,
the gateway's limits), with :mod:`.sampling` (penalties, bias, choices, logprobs, echo),
:mod:`.structured_output` (``response_format`` and ``guided_*``), :mod:`.tool_calling`
(``tools``, ``tool_choice`` and the calls in replies) and :mod:`.unsupported` (features
refused with a 400); :mod:`.generation_response` (engine messages -> completion objects and
stream chunks) with :mod:`.logprobs`. Embeddings: :mod:`.embeddings`. Speech to text:
:mod:`.audio` (request, and the ``response_format`` renderers). Videos: :mod:`.videos`
(the job requests, and the video, list and deletion objects).
"""

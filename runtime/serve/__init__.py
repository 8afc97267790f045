"""`conductor serve`: the conductor system (a pool and a policy version) as an OpenAI-compatible
model over HTTP. One module a concern: shapes (the OpenAI wire format), access (keys, the
loopback rule), catalog (model names and policy versions), conversation (a chat as a task), app
(the routes, one run per request, cancel on disconnect), guard (uvicorn's protocol with bounds on
slow and hostile clients). The command is runtime/cli/serve.py.

Importing this package needs the `serve` extra (Starlette, uvicorn).
"""

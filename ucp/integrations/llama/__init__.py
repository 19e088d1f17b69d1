"""A small Llama-style decoder and its data, shared by the reference trainers.

``ucp.integrations.llama.model``: the logical model; ``.config``: its hyper-parameters;
``.data``: a deterministic synthetic corpus; ``.reference``: the single-process run
every parallel run is compared with.
"""

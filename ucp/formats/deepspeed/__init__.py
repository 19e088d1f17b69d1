"""DeepSpeed's checkpoint folders, read and written without importing DeepSpeed (docs/CONVERT.md).

One module per idea: :mod:`.pt` (restricted unpickling and streaming ``.pt`` writing),
:mod:`.plain` (foreign objects as JSON-safe plain data), :mod:`.flat` and :mod:`.optim` (ZeRO's
flat partitions and optimizer files), :mod:`.zero`, :mod:`.pipeline` and :mod:`.universal` (the
three formats, each registered with :mod:`ucp.formats` on import) and :mod:`.universal_writer`.
"""

"""The stream layer: sources, the arrival order, event time, windows and workloads.

``adaptcq.stream`` is also the streaming API: ``adaptcq.stream(sql, sources, ...)`` runs a
continuous query and yields its results as Arrow record batches (see
``adaptcq.runtime.local.stream``). The package and the function share the name, so this
module is made callable.
"""

import sys
import types


class _StreamModule(types.ModuleType):
    def __call__(self, *args, **kwargs):
        from adaptcq.runtime.local import stream
        return stream(*args, **kwargs)

    __call__.__doc__ = "adaptcq.stream(sql, sources, ...): see adaptcq.runtime.local.stream"


sys.modules[__name__].__class__ = _StreamModule

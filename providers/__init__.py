"""Cloud providers: one small protocol, one module per cloud, and the bundled price catalog.

Nothing here imports ``broker`` or ``policies``; the cloud SDKs are imported lazily by the
module of the cloud that needs them, so ``broker quote`` never pays for them.
"""

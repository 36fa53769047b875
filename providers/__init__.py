"""Cloud providers: one small protocol, one package per cloud, the registry that lists them, and
the bundled price catalog.

Nothing here imports ``broker`` or ``policies``; the cloud SDKs are imported lazily by the
modules of the cloud that needs them, so ``broker quote`` never pays for them.

Adding a cloud
--------------
A cloud is one package, one line in :data:`providers.registry.REGISTRY` and its data; every list
of clouds, the ``[providers]`` settings table, each dispatch (building the provider, the market
refresh, a quota refresh after a launch met a quota error, node-name checks), the CLI's choices,
the catalog's tables, the house test's SDK rule and the sandbox's wiring derive from the registry.

1. ``providers/<cloud>/`` (a package of its own; the cloud's name, which the registration
   carries, is 2-16 lowercase letters and digits, and the package may be named otherwise, e.g.
   ``lambda_cloud`` for ``lambda``, a Python keyword):

   - ``settings.py``: the ``[providers.<cloud>]`` schema, a :class:`providers.settings.Table` with
     ``enabled: bool = False``, ``regions`` (the regions quotes may use) and every key the cloud needs, checked in ``__post_init__`` with
     :func:`providers.settings.bad` (sentences name the key);
   - a module with the :class:`providers.base.Provider` (``launch``, ``describe``,
     ``list_managed``, ``terminate``, and a ``from_config(settings, owner=...)`` classmethod;
     errors mapped onto :mod:`providers.base`'s typed errors); only the package's own modules
     and its market source may import its SDK at module level;
   - a market source, an object implementing :class:`providers.market.MarketSource` (``sources``
     it has, at least ``"price_list"``; ``fetch``, ``quotas``, ``needs``); it may live in the
     package or in ``providers/market/<cloud>.py``;
   - a node-name rule, ``node_name_problem(name) -> str`` ("" when the cloud takes the name);
   - ``boot.py``: what its node does at boot on its own, a
     :class:`providers.registration.BootHooks` (learn its name from the cloud's metadata, so the
     nodes of a multi-node lease tell themselves apart; watch its own interruption notices when
     the broker cannot read them from the cloud's API);
   - ``__init__.py`` builds ``REGISTRATION = CloudRegistration(name=..., title=..., provider=
     "providers.<cloud>.launch:Class", settings=Schema, market="module:OBJECT",
     node_name_problem=..., sdk_modules=(...), sandbox="broker_sandbox.<cloud>:sandbox_cloud",
     boot=BOOT)``
     (:class:`providers.registration.CloudRegistration`) and imports nothing that loads its SDK.

2. ``providers/registry.py``: the line ``<cloud>.REGISTRATION,`` in ``REGISTRY`` (and the
   package in its ``from providers import ...``).

3. Its data in ``providers/data/``: ``[<cloud>]`` network, storage and SLA terms (and its egress
   tiers) in ``network.toml``, its rows in ``instances.csv``, ``regions.csv`` and ``prices.csv``,
   each dated and sourced (``providers/data/README.md``); ``[providers.<cloud>]`` in
   ``deploy/broker.example.toml`` with every key of its schema.

4. Its fake in ``broker_sandbox/<cloud>.py``: a loopback server speaking the cloud's real paths,
   shapes and error codes, and ``sandbox_cloud(market=False)`` returning a
   :class:`broker_sandbox.SandboxCloud` (its fakes, its ``[providers.<cloud>]`` table, its live
   instances); ``broker sandbox`` and ``tests/clouds`` then run it with the others.

``tests/test_registry.py`` fails when a registered cloud lacks any of these parts, and shows a
cloud added by its registration line alone picked up by the settings, dispatch, CLI, catalog,
quotes, boot scripts and sandbox.
"""

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

1. ``providers/<cloud>/`` (the package name is the cloud's name, 2-16 lowercase letters and
   digits; a name that is a Python keyword takes a suffix: Lambda Cloud's ``lambda`` lives in
   ``providers/lambda_cloud/``):

   - ``settings.py``: the ``[providers.<cloud>]`` schema, a :class:`providers.settings.Table` with
     ``enabled: bool = False`` and every key the cloud needs, checked in ``__post_init__`` with
     :func:`providers.settings.bad` (sentences name the key);
   - a module with the :class:`providers.base.Provider` (``launch``, ``describe``,
     ``list_managed``, ``terminate``, and a ``from_config(settings, owner=...)`` classmethod;
     errors mapped onto :mod:`providers.base`'s typed errors); only the package's own modules
     and its market source may import its SDK at module level;
   - a market source, an object implementing :class:`providers.market.MarketSource` (``sources``
     it has, at least ``"price_list"``; ``fetch``, ``quotas``, ``needs``); it may live in the
     package or in ``providers/market/<cloud>.py``;
   - a node-name rule, ``node_name_problem(name) -> str`` ("" when the cloud takes the name);
   - ``__init__.py`` builds ``REGISTRATION = CloudRegistration(name=..., title=..., provider=
     "providers.<cloud>.launch:Class", settings=Schema, market="module:OBJECT",
     node_name_problem=..., sdk_modules=(...), sandbox="broker_sandbox.<cloud>:sandbox_cloud")``
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
cloud added by its registration line alone picked up by the settings, dispatch, CLI and catalog.
What a cloud's node does at boot (its metadata service, in ``providers/bootstrap.py``) is not in
the registration yet: a multi-node lease on a cloud without an entry there is refused at launch.
"""

"""Kubernetes and Kueue: the broker watches the cluster's GPU queue and bursts for it.

- :mod:`~broker.kubernetes.settings` — the ``[kubernetes]`` section;
- :mod:`~broker.kubernetes.informer` — list-then-watch of one collection (resourceVersion,
  bookmarks, relist on 410 Gone) through the official ``kubernetes`` client;
- :mod:`~broker.kubernetes.objects` — pods, nodes, Workloads and LocalQueues → the one queue
  model (:class:`policies.queue.QueueSnapshot`);
- :mod:`~broker.kubernetes.watcher` — the watcher of ``broker serve``.

Submodules are imported where they are used; the ``kubernetes`` client only when a watcher
connects, so the CLI and a server without ``[kubernetes] enabled`` never load it.
"""

"""Feast and this project: Feast's SDK on this project's Redis layout, in Feast's process
(``online_store``: the online store plugin and its settings, with ``plans`` and
``answers``),
Feast's SDK reading from this project's server with typed answers (``remote``), and Feast's
definitions as this project's registry (``mapping``; ``importer``: ``feature-store
import-feast``).

Feast is an optional dependency (``pip install 'feature-store[feast]'``): only these
modules import it, and nothing imports them but Feast (by the ``type:`` of its
``feature_store.yaml``) and ``import-feast``.
"""

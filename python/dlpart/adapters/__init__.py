"""Adapters between dlpart and the systems that hold partitioned data.

Each adapter is its own module, imported on demand so that dlpart never needs the system it
adapts: ``dlpart.adapters.jax`` (sharded ``jax.Array``), ``dlpart.adapters.dask`` (Dask arrays on
a ``distributed`` cluster, handles are futures), ``dlpart.adapters.ray`` (Ray ObjectRefs), and
the forms the two consumers of ``__partitioned__`` read: ``dlpart.adapters.heat`` (MPI ranks) and
``dlpart.adapters.xgboost_ray`` (bare node addresses).
Every adapter keeps the locality it knows (host, pid, device) in the partitions' locations.
"""

__all__ = ["dask", "heat", "jax", "ray", "xgboost_ray"]

"""Adapters between dlpart and the systems that hold partitioned data.

Each adapter is its own module, imported on demand so that dlpart never needs the system it
adapts: ``dlpart.adapters.jax`` (sharded ``jax.Array``), ``dlpart.adapters.dask`` (Dask arrays on
a ``distributed`` cluster, handles are futures), ``dlpart.adapters.ray`` (Ray ObjectRefs).
Every adapter keeps the locality it knows (host, pid, device) in the partitions' locations.
"""

__all__ = ["dask", "jax", "ray"]

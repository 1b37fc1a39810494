"""An unmodified user program: no tpuctl import, jax.distributed.initialize() with no arguments."""

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

jax.distributed.initialize()

mesh = Mesh(np.asarray(jax.devices()), ("i",))
# Device k of the job contributes k + 1, so the psum over all devices is n (n + 1) / 2.
position = {d: k for k, d in enumerate(jax.devices())}
local = np.asarray([position[d] for d in jax.local_devices()], dtype=np.float32)
ids = jax.make_array_from_process_local_data(NamedSharding(mesh, P("i")), local)
total = jax.jit(
    jax.shard_map(lambda x: jax.lax.psum(jnp.sum(x + 1), "i"), mesh=mesh, in_specs=P("i"), out_specs=P())
)(ids)
print(
    "RESULT",
    jax.process_index(),
    jax.process_count(),
    jax.device_count(),
    jax.local_device_count(),
    float(total.addressable_data(0)),
    flush=True,
)

"""Device meshes for sharded generation: axes "data" (batch rows) and "model" (tensor parallel).

Everything parallel in specjax is expressed as shardings over this one 2-D mesh; the XLA
SPMD partitioner inserts the collectives. The axes are `Auto`, so shardings given to the
inputs (params, prompts) propagate through the whole jitted generation loop.
"""

from __future__ import annotations

import jax
import numpy as np
from jax.sharding import AxisType, Mesh

DATA, MODEL = "data", "model"
AXES = (DATA, MODEL)


def make_mesh(data: int = 1, model: int | None = None, devices=None) -> Mesh:
    """A ("data", "model") mesh of data x model devices.

    model: None takes every remaining device (len(devices) // data). devices: default
    `jax.devices()`, all devices of all processes (multi-host: call
    `specjax.distributed.initialize` first). The first data x model devices are used, laid
    out by `jax.make_mesh` so that the "model" axis, which all-reduces every layer, gets
    the fastest links. Raises ValueError naming the numbers when the mesh cannot be built.
    """
    devices = list(jax.devices() if devices is None else devices)
    for name, value in (("data", data), ("model", model)):
        if value is not None and (not isinstance(value, int | np.integer) or value < 1):
            raise ValueError(f"mesh axis {name} must be an integer >= 1, got {value!r}")
    if model is None:
        if len(devices) % data:
            raise ValueError(f"mesh data={data} does not divide the {len(devices)} devices; pass model= explicitly")
        model = len(devices) // data
    needed = data * model
    if needed > len(devices):
        raise ValueError(
            f"mesh data={data} x model={model} needs {needed} devices, but only {len(devices)} exist "
            f"({devices[0].platform if devices else 'none'})"
        )
    if needed == len(devices):
        return jax.make_mesh((data, model), AXES, (AxisType.Auto, AxisType.Auto), devices=devices)
    return Mesh(np.asarray(devices[:needed]).reshape(data, model), AXES, axis_types=(AxisType.Auto, AxisType.Auto))


def parse_mesh(text: str) -> dict[str, int]:
    """ "data=2,model=4" (the CLI and bench form) -> {"data": 2, "model": 4}; either may be left out."""
    sizes = {}
    for part in str(text).replace(" ", "").split(","):
        if not part:
            continue
        name, sep, value = part.partition("=")
        if not sep or name not in AXES or not value.isdigit():
            raise ValueError(f"mesh must look like 'data=2,model=4' (axes {', '.join(AXES)}), got {text!r}")
        sizes[name] = int(value)
    if not sizes:
        raise ValueError(f"mesh must look like 'data=2,model=4', got {text!r}")
    return sizes


def mesh_from(spec) -> Mesh | None:
    """A Mesh from what configs and the CLI give: None, a Mesh, "data=2,model=4" or {"data": 2, "model": 4}."""
    if spec is None or isinstance(spec, Mesh):
        return spec
    sizes = parse_mesh(spec) if isinstance(spec, str) else dict(spec)
    unknown = set(sizes) - set(AXES)
    if unknown:
        raise ValueError(f"unknown mesh axes {sorted(unknown)}: the axes are {', '.join(AXES)}")
    return make_mesh(data=sizes.get(DATA, 1), model=sizes.get(MODEL))


def mesh_shape(mesh: Mesh) -> tuple[int, int]:
    """(data, model) sizes of a specjax mesh."""
    return mesh.shape[DATA], mesh.shape[MODEL]


def params_mesh(params) -> Mesh | None:
    """The mesh a params pytree is laid out on, or None when it is not NamedSharding-placed."""
    for leaf in jax.tree.leaves(params):
        sharding = getattr(leaf, "sharding", None)
        if isinstance(sharding, jax.sharding.NamedSharding) and set(AXES) <= set(sharding.mesh.axis_names):
            return sharding.mesh
    return None

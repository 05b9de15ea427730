"""The port author's tools: trace files under the official module names, the comparison of two traces,
the ``refimpl trace / compare / golden`` commands, and seeded synthetic checkpoints in the released
layout (``synthetic``, ``presets``). Nothing in the networks imports this layer."""

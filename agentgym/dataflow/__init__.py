"""The dataflow layer: rollout services, buffers, trainers and weight sync (see DESIGN.md, Dataflow).

Submodules load lazily; ``agentgym.dataflow.weightsync`` publishes trainer weights to policies.
"""

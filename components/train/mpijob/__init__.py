"""The MPIJob backend of the train component.

Import what you need from its modules (nothing is imported eagerly, so ``kubernetes`` and
``jsonschema`` load only where a manifest is validated or a job is run):

- `manifest`: `ClusterJobParams` and the pure `build_manifest`;
- `validate`: the CRD-schema check, `validate_manifest`;
- `lifecycle`: `run_mpijob`, which creates, follows and cancels the job on a cluster.
"""

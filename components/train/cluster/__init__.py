"""The train step's cluster backends, one module each (`mpijob`, `trainjob`), and what they share:
the job (`job`), its pods (`pods`) and the one run (`run`); the CRD check is
`components.common.crd`. mpijob.md and trainjob.md describe them. Nothing is imported eagerly."""

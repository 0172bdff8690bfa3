"""The train step's cluster backends, one module each (`mpijob`, `trainjob`), and what they share:
the job (`job`), its pods (`pods`), the job's schema as the cluster serves it (`schema`), the
launcher's log (`launcher_log`) and the one run (`run`); the offline CRD check of the render
commands is `components.common.crd`. mpijob.md and trainjob.md describe them. Nothing is
imported eagerly."""

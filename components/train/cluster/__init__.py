"""The train step's cluster backends, one module each (`mpijob`, `trainjob`), and what they share:
the job (`job`), its pods (`pods`), the CRD check (`crd`) and the one run (`run`); mpijob.md and
trainjob.md describe them. Nothing is imported eagerly."""

"""Gloo's timeout in an elastic job: what the launcher sets for a local elastic job, and what each
rank sets before it joins (`components.train.rank.elastic`). Runs in the launcher and in each
rank.
"""

# Gloo's timeout (Horovod's HOROVOD_GLOO_TIMEOUT_SECONDS, 30 s by default) in a local elastic job.
# When a rank is lost, one survivor's collective fails at once (its connection to the lost rank
# closes), but another can be left in a receive nothing will complete ("Timed out waiting 30000ms
# for recv operation"), and the job forms its new world only when every survivor has reset: recovery
# took 30.1 s in 2 of 6 trials here, 0.2-0.3 s in the others (debug logs; the bench: 2 of 3, 1 of
# 3). The rendezvous share the timeout: a job's ranks start together (0.1-0.8 s apart, measured
# here), but a worker that joins starts its process only then, so the reset before a join takes
# Horovod's default (`JOIN_GLOO_TIMEOUT_S`, which `components.train.rank.elastic` sets; with 5 s
# there, the test's join failed: "Wait timeout after 5 seconds for key(s): 2").
GLOO_TIMEOUT_ENV = "HOROVOD_GLOO_TIMEOUT_SECONDS"
ELASTIC_GLOO_TIMEOUT_S = 5
JOIN_GLOO_TIMEOUT_S = 30

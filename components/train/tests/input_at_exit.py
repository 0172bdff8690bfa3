"""``python input_at_exit.py RECORD_DIR -m MODULE ARGS...``: run a module and record, in
``RECORD_DIR/rank-<rank>.txt``, what becomes of its ``tf.data`` input when the process ends.

Its exit handler, registered before the module runs and so the last of them to run (they run
newest first), writes ``alive N``: the ``tf.data`` iterators still alive then, found by the
garbage collector among every object of the process. Each of them, if destroyed after that
(Python's finalization, as a plain ``sys.exit`` runs it), writes a line ``destroyed``: it is
given an attribute whose ``__del__`` writes it (``weakref.finalize`` would not do: its exit
function, registered by the first one a process makes, ``tempfile``'s for instance, turns
them all off before this handler runs).

What the trainer's input hold (`components.train.rank.held_input`) promises reads, on every rank:
``alive 1`` (fit's iterator, kept past ``fit`` to the very end) and nothing destroyed.
"""

import atexit
import gc
import os
import runpy
import sys

record_dir = sys.argv[1]
assert sys.argv[2] == "-m"
module = sys.argv[3]
rank = os.environ.get("OMPI_COMM_WORLD_RANK", os.environ.get("HOROVOD_RANK", "none"))
os.makedirs(record_dir, exist_ok=True)
# a raw descriptor: written to by finalizers after the file objects may have been closed
record = os.open(
    os.path.join(record_dir, f"rank-{rank}.txt"), os.O_WRONLY | os.O_CREAT | os.O_APPEND
)


class Destroyed:
    """Writes ``destroyed`` when the object holding it is destroyed."""

    def __init__(self) -> None:
        self.write, self.record = os.write, record  # not through globals cleared at finalization

    def __del__(self) -> None:
        self.write(self.record, b"destroyed\n")


def input_at_exit() -> None:
    tf = sys.modules.get("tensorflow")
    if tf is None:  # the module never imported TensorFlow: no input to speak of
        os.write(record, b"alive 0\n")
        return
    alive = [o for o in gc.get_objects() if isinstance(o, tf.data.Iterator)]
    os.write(record, f"alive {len(alive)}\n".encode())
    for iterator in alive:
        vars(iterator)["_input_at_exit"] = Destroyed()  # past the class's __setattr__


atexit.register(input_at_exit)
sys.argv = [module, *sys.argv[4:]]
runpy.run_module(module, run_name="__main__", alter_sys=True)

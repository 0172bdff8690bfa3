"""A Python function made from a signature, whose source KFP can embed in a component.

KFP's lightweight components ship their function's source into the container, so a component
whose parameters come from declarations needs them written out: ``def NAME(PARAMETERS) ->
RETURNS:`` handing its arguments to the step's program inside `one_line_failures` and
`stops_on_signals` (a stopped step ends what it started, in one line, exit 128 + N). The source
is registered with `linecache`, where ``inspect.getsource`` (which KFP calls) finds it.
"""

from __future__ import annotations

import itertools
import linecache
import textwrap
from collections.abc import Callable, Sequence
from typing import Any

_count = itertools.count()


def kfp_function(
    name: str, parameters: Sequence[tuple[str, str]], returns: str, program: str, doc: str
) -> Callable[..., Any]:
    """``def name(p: annotation, ...) -> returns:`` returning ``program(**arguments)``, where
    `program` is ``"package.module:function"``, with `doc` as its docstring.

    `parameters` are (name, annotation source) pairs; annotations and `returns` may use what
    KFP's own component source imports (``from kfp.dsl import *``, ``from typing import *``).
    """
    module, function = program.split(":")
    body = (
        "arguments = dict(locals())\n"  # before the imports, which bind locals too
        "from components.common.failure import one_line_failures, stops_on_signals\n"
        "with one_line_failures(), stops_on_signals():\n"
        f"    from {module} import {function}\n"
        f"    return {function}(**arguments)"
    )
    signature = ",\n".join(f"    {p}: {annotation}" for p, annotation in parameters)
    source = (
        f"def {name}(\n{signature},\n) -> {returns}:\n"
        f"{textwrap.indent(repr(doc), '    ')}\n{textwrap.indent(body, '    ')}\n"
    )
    filename = f"<kfp-horovod generated {name} {next(_count)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec("import kfp\nfrom kfp.dsl import *\nfrom typing import *", namespace)
    exec(compile(source, filename, "exec", dont_inherit=True), namespace)  # no PEP 563 here
    func: Callable[..., Any] = namespace[name]
    return func

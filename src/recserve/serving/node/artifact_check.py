"""A repository version's artifact checked in a child process (``check_in_child``): the user's model runs its one
check batch there, so a model that crashes, hangs or allocates wildly when it loads costs that child, never the
server process that serves every other model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from recserve.hostinfo import how_it_ended

CHECK_TIMEOUT_S = 300.0  # loading and one batch of 2: a model still at it after this is taken to hang


def _check(conn: Any, artifact: str, spec: Any) -> None:
    """The child's work: the check's verdict (None, or why the artifact is refused) and the largest batch the
    artifact takes (``batch_bound``) sent back."""
    from recserve.zoo.artifacts import ArtifactError, batch_bound, check_artifact

    bound = None
    try:
        bound = batch_bound(check_artifact(Path(artifact), spec))
    except ArtifactError as exc:
        verdict: str | None = exc.reason
    except BaseException as exc:  # noqa: BLE001 - whatever loading raises, the artifact is refused with it
        verdict = f"loading it raised {type(exc).__name__}: {exc}"
    else:
        verdict = None
    conn.send((verdict, bound))
    conn.close()


def check_in_child(context: Any, artifact: Path, spec: Any, timeout_s: float = CHECK_TIMEOUT_S) -> int | None:
    """Run ``check_artifact`` in a process of ``context`` (the workers' forkserver); raise ``ArtifactError`` with the
    check's reason, or with how its process died or that it did not finish; else return the largest batch the
    artifact takes (None: any).  Blocks: call it off the event loop."""
    from recserve.zoo.artifacts import CHECK_BATCH, ArtifactError  # torch: imported where a model is checked

    reader, writer = context.Pipe(duplex=False)
    process = context.Process(target=_check, args=(writer, str(artifact), spec), daemon=True,
                              name=f"recserve-check-{Path(artifact).parent.name}")
    process.start()
    writer.close()
    bound = None
    try:
        verdict, bound = reader.recv() if reader.poll(timeout_s) else \
            (f"checking it ran over {timeout_s:.0f} s (loading and one batch of {CHECK_BATCH}); stopped", None)
    except EOFError:  # the process ended without a verdict
        process.join(5)
        verdict = (f"the process checking it (loading and one batch of {CHECK_BATCH}) ended: "
                   f"{how_it_ended(process.exitcode)}")
    finally:
        if process.is_alive():
            process.kill()
        process.join(5)
        reader.close()
    if verdict is not None:
        raise ArtifactError(artifact, verdict)
    return bound


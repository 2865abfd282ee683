"""A run's quality in words, the one sentence every face shows beside its speed: "quality kept:
99.6% of tokens identical to step 1 (baseline), mean KLD 0.0012" (the CLI's ``compare``, the
Compare card, the presentation's before/after view, the HTML report, a launch script's header,
the cost line and the Live tile). Greyed where the figures stay within the reference's own noise
floor: there nothing was measurably lost. Pure Python; no Qt."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class QualityKept:
    """What a run's quality figures say, as the faces show them."""

    text: str
    """The whole line: ``quality kept: 99.6% of tokens identical to BF16, mean KLD 0.0012 ± 0.0003``."""
    figure: str
    """The big number of a tile: ``99.6%``, ``= ref`` for the reference itself, ``n/a``."""
    detail: str
    """Under the figure, short enough for a tile on a projector: ``KLD 0.0012 (within noise)``
    (the reference is named in ``text``)."""
    short: str
    """Beside a price: ``quality kept 99.6%``; empty when nothing was measured."""
    greyed: bool
    """Nothing measurably lost: the figures stay within the reference's noise floor (or the run is
    the reference itself)."""
    measured: bool


def reference_name(shown: Mapping[str, Any], reference_label: str | None = None) -> str:
    """Who the run was compared with: ``reference_label`` (a face's own name for that run, such as
    Compare's ``#12 fp16``), else the stored label, else the run id or the kind of reference."""
    ref = shown.get("reference") or {}
    if reference_label:
        return reference_label
    if ref.get("label"):
        return str(ref["label"])
    if ref.get("run_id") is not None:
        return f"run {ref['run_id']}"
    return str(ref.get("kind") or "the reference")


def _kld_text(kld: Mapping[str, Any]) -> str:
    """``mean KLD 0.0012 ± 0.0003`` (a ``+`` where the tail beyond top-k makes it a lower bound)."""
    bound = "+" if kld.get("positions_with_tail") else ""
    error = kld.get("error")
    return f"mean KLD {kld.get('mean', 0.0):.2g}{bound}" + (f" \u00b1 {error:.1g}" if error else "")


def _accuracy_text(accuracy: Mapping[str, Any] | None) -> str:
    """``demo_repeat accuracy 94.0% ± 2.1% (reference 95.0%)``; empty where lm-eval scored nothing."""
    if not accuracy or not isinstance(accuracy.get("value"), int | float):
        return ""
    error = accuracy.get("stderr")
    reference = accuracy.get("reference_value")
    return (f"{accuracy.get('task') or 'task'} accuracy {accuracy['value']:.1%}"
            + (f" \u00b1 {error:.1%}" if isinstance(error, int | float) else "")
            + (f" (reference {reference:.1%})" if isinstance(reference, int | float) else ""))


def quality_kept(shown: Mapping[str, Any] | None, reference_label: str | None = None) -> QualityKept | None:
    """A run's ``quality`` (``QualityFigures`` as JSON, with or without the outputs kept) in
    words; None for a run without a probe. ``reference_label`` names the reference as the face
    names it (else its stored label)."""
    if not shown:
        return None
    accuracy = _accuracy_text(shown.get("accuracy"))
    if not shown.get("measured"):
        why = str(shown.get("error") or "no probe ran")
        return QualityKept(text=f"quality not measured: {why}" + (f"; {accuracy}" if accuracy else ""),
                           figure="n/a", detail="not measured", short="", greyed=True, measured=False)
    agreement, kld = shown.get("agreement") or {}, shown.get("kld") or {}
    share = agreement.get("token_share")
    share_text = f"{share:.1%}" if isinstance(share, int | float) else "?"
    parts = [_kld_text(kld)] if kld else []
    parts += [accuracy] if accuracy else []
    if (shown.get("reference") or {}).get("kind") == "self":
        floor = f"; noise floor {_kld_text(kld)}" if kld.get("mean") else ""
        return QualityKept(text=f"quality: the reference itself ({share_text} of tokens identical on a repeat"
                                f"{floor})" + (f"; {accuracy}" if accuracy else ""),
                           figure="= ref", detail=(f"floor KLD {kld['mean']:.2g}" if kld.get("mean")
                                                   else "the reference"),
                           short="", greyed=True, measured=True)
    name = reference_name(shown, reference_label)
    within = bool(shown.get("within_noise"))
    text = f"quality kept: {share_text} of tokens identical to {name}" + "".join(f", {p}" for p in parts)
    detail = (f"KLD {kld.get('mean', 0.0):.2g}" + ("+" if kld.get("positions_with_tail") else "")) if kld \
        else "of tokens identical"
    return QualityKept(text=text + ("; within the noise floor" if within else ""), figure=share_text,
                       detail=detail + (" (within noise)" if within else ""), short=f"quality kept {share_text}",
                       greyed=within, measured=True)

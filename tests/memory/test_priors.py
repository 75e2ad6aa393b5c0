"""The priors as one frozen value with a source per field (launcher/memory/priors.py). Pure."""

from __future__ import annotations

import dataclasses

import pytest

from launcher.memory.priors import (
    DEFAULT_COEFFICIENTS,
    DEFAULT_PRIORS,
    Coefficients,
    Priors,
    sources,
)


@pytest.mark.parametrize("value", [DEFAULT_PRIORS, DEFAULT_COEFFICIENTS],
                         ids=["policy", "estimate"])
def test_every_prior_states_its_source(value: Priors | Coefficients) -> None:
    names = {f.name for f in dataclasses.fields(value)} - {"coefficients"}
    given = sources(value)
    assert set(given) == names
    assert all(len(s) > 10 for s in given.values())


def test_the_priors_are_frozen_and_a_what_if_is_a_new_value() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        DEFAULT_PRIORS.kv_cushion = 0.1  # type: ignore[misc]
    wider = dataclasses.replace(DEFAULT_PRIORS, kv_cushion=0.1)
    assert (wider.kv_cushion, DEFAULT_PRIORS.kv_cushion) == (0.1, 0.02)
    assert DEFAULT_PRIORS.coefficients is DEFAULT_COEFFICIENTS


def test_the_warmup_guess_is_a_share_of_pre_within_its_clamps() -> None:
    p = DEFAULT_PRIORS
    assert (p.warmup_gib(10.0), p.warmup_gib(60.0), p.warmup_gib(200.0)) == (0.5, 1.2, 2.5)
    assert p.scaled_warmup(2.0).warmup_gib(60.0) == pytest.approx(2.4)
    assert p.scaled_warmup(0.0).warmup_gib(60.0) == 0.0

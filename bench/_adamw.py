"""AdamW settings shared by the trained and the synthetic sequences: torch's defaults, as RL trainers use them."""

BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01


def adamw_record() -> dict[str, object]:
    """The settings as recorded in run.json."""
    return {"betas": list(BETAS), "eps": EPS, "weight_decay": WEIGHT_DECAY}

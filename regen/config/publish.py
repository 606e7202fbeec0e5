"""A published dataset's Hub repo and what goes into it: the flow's `publish` parameter and
the options `regen publish` takes, one model for both (the publisher is `regen.publish`)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator

from regen.config.uris import HubRepoTarget
from regen.errors import ConfigError


class PublishConfig(BaseModel):
    """Publish a finished dataset to a Hugging Face Hub dataset repo: its rows as Parquet, its
    report's plots and provenance, and a card made from what the run recorded."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    repo: str = Field(
        description="The dataset repo: hf://datasets/ORG/NAME (or hf://ORG/NAME); created "
        "when missing."
    )
    revision: str = Field(
        default="main",
        min_length=1,
        description="The branch the commit goes to; created from main when missing.",
    )
    private: bool = Field(
        default=True,
        description="A repo created here is private unless this is false; an existing "
        "repo's visibility is never changed.",
    )
    tokenized: bool = Field(
        default=False,
        description="Also publish the `tokenized` config: the hf-dataset export's rows "
        "(id, input_ids, loss_mask, seq_len: the server's own tokens and the loss mask).",
    )
    license: str | None = Field(
        default=None,
        description="The card's license id; default the prompt source's card's license, "
        "else `unknown`.",
    )
    hf_token_secret: str | None = Field(
        default=None,
        description="A flow run's Hub token with write access: the name of a Prefect Secret "
        "block holding it (default HF_TOKEN in the worker's environment). Never a token.",
    )

    @field_validator("repo")
    @classmethod
    def _repo(cls, value: str) -> str:
        try:
            HubRepoTarget.parse(value)
        except ConfigError as err:
            raise ValueError(str(err)) from None
        return value

    @property
    def target(self) -> HubRepoTarget:
        return HubRepoTarget.parse(self.repo)

"""Draft sources for speculative decoding: the n-gram index and the draft-length controller."""

from echoline.engine.drafting.controller import AcceptanceModel, DraftController, VerifyCost
from echoline.engine.drafting.ngram_index import Draft, NgramIndex

__all__ = ["AcceptanceModel", "Draft", "DraftController", "NgramIndex", "VerifyCost"]

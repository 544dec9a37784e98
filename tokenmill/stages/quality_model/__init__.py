"""Model-based quality scoring: a fastText classifier (trained by `tokenmill train-quality`, tokenmill.quality_training)
or a transformers sequence-classification model, loaded from disk only and scored in batches. No Dagster import, and
no other stage's code: the training texts are read and prepared in tokenmill.quality_training, which may import the
raw and clean stages."""

from tokenmill.stages.quality_model.fasttext_model import train_fasttext
from tokenmill.stages.quality_model.metrics import held_out_metrics
from tokenmill.stages.quality_model.model import QualityModel, load_quality_model, model_id, model_kind
from tokenmill.stages.quality_model.settings import QualityModelCard, QualityTrainSettings

__all__ = [
    "QualityModel",
    "QualityModelCard",
    "QualityTrainSettings",
    "held_out_metrics",
    "load_quality_model",
    "model_id",
    "model_kind",
    "train_fasttext",
]

"""gptkit.demo's pre-training recipes: typed as TrainConfig's fields are, and built into the one
config `gptkit pretrain` takes."""

from __future__ import annotations

import dataclasses
import typing

import pytest

from gptkit.demo import RECIPES, PretrainRecipe
from gptkit.train.config import TrainConfig


def test_a_recipe_takes_train_configs_types_and_builds_one_pretrain_config(tmp_path):
    recipe, train = typing.get_type_hints(PretrainRecipe), typing.get_type_hints(TrainConfig)
    assert (recipe["schedule"], recipe["optimizer"]) == (train["schedule"], train["optimizer"])
    with pytest.raises(ValueError, match=r"^PretrainRecipe.schedule \(--schedule\): must be one of"):
        dataclasses.replace(RECIPES["minutes"], schedule="wsdd")

    config = RECIPES["minutes"].configs(tmp_path / "shards", tmp_path / "out", "2m", max_steps=1000)
    assert (config.data, config.out) == (str(tmp_path / "shards"), str(tmp_path / "out"))
    assert (config.model.n_layer, config.model.d_model, config.model.dropout) == (2, 256, 0.0)
    training = config.training
    assert (training.schedule, training.optimizer, training.lr, training.batch_size) == (
        "wsd",
        "muon",
        6e-3,
        16,
    )
    assert (training.time_budget, training.max_steps, training.checkpoint_every) == ("2m", 1000, 1000)

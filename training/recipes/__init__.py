"""The authors' recipes as reviewed presets: `--recipe NAME` loads `NAME.yaml` from this folder, each value commented
with where it comes from. A recipe sets argument defaults; a flag given on the command line overrides it."""

from pathlib import Path

import yaml

RECIPES = Path(__file__).resolve().parent


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES.glob("*.yaml"))


def load_recipe(name: str) -> dict:
    """The values of recipe `name`, keyed by argument name (plus "script", the module it is for)."""
    if name not in recipe_names():
        raise ValueError(f"--recipe {name!r} is not a recipe; choose one of {', '.join(recipe_names())}.")
    with open(RECIPES / f"{name}.yaml") as f:
        return yaml.safe_load(f)

"""The authors' recipes as reviewed presets: `--recipe NAME` loads `NAME.yaml` from this folder, each value commented
with where it comes from. A recipe sets argument defaults; a flag given on the command line overrides it."""

from pathlib import Path

import yaml

RECIPES = Path(__file__).resolve().parent


def recipe_names() -> list[str]:
    return sorted(path.stem for path in RECIPES.glob("*.yaml"))


def load_recipe(name: str) -> dict:
    """The values of recipe `name`, keyed by argument name (plus "script", the module it is for). A file that is no
    YAML mapping of argument names with a "script" (a list, nothing, a YAML tag, another script's keys) is a
    ValueError naming it."""
    if name not in recipe_names():
        raise ValueError(f"--recipe {name!r} is not a recipe; choose one of {', '.join(recipe_names())}.")
    path = RECIPES / f"{name}.yaml"
    try:
        with open(path) as f:
            values = yaml.safe_load(f)
    except yaml.YAMLError as error:  # a tag such as !!python/object is one: safe_load builds plain values only
        raise ValueError(f"{path} is not a recipe: not plain YAML ({' '.join(str(error).split())[:200]}).") from None
    if not isinstance(values, dict) or not isinstance(values.get("script"), str):
        found = "nothing" if values is None else f"a {type(values).__name__}" if not isinstance(values, dict) else (
            "no script")
        raise ValueError(f"{path} is not a recipe: it holds {found}, where a recipe is a mapping of argument names to "
                         "values with `script: MODULE` (e.g. training/recipes/finetune-final.yaml).")
    if unnamed := [key for key in values if not isinstance(key, str)]:
        raise ValueError(f"{path} is not a recipe: {unnamed[0]!r} is no argument name.")
    return values

"""The recipe schema, its validation and stage merging."""

from flightdeck.recipe.findings import Finding, FindingError, Severity
from flightdeck.recipe.schema import Recipe, recipe_json_schema
from flightdeck.recipe.validate import RecipeInvalid, expand_stages, parse_recipe

__all__ = [
    "Finding",
    "FindingError",
    "Recipe",
    "RecipeInvalid",
    "Severity",
    "expand_stages",
    "parse_recipe",
    "recipe_json_schema",
]

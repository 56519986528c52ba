"""Backends: from a plan and a recipe to the process that trains (swift sft, megatron sft, the Unsloth runner),
and from an adapter to merged weights for vLLM. See docs/backends.md.

    from swift_vora.backends import build_launch, load_recipe, plan_recipe
    recipe = load_recipe('recipes/3060x4.yaml', ['video.max_frames=32'])
    launch = build_launch(plan_recipe(recipe), recipe)   # Launch(argv, env, files); launch.run()

Importing this package imports neither torch nor ms-swift.
"""
from .base import Launch, LaunchRefused, LaunchUsageError
from .launch import build_launch
from .planning import plan_recipe
from .recipe import Recipe, RecipeError, load_recipe

__all__ = ['Launch', 'LaunchRefused', 'LaunchUsageError', 'Recipe', 'RecipeError', 'build_launch', 'load_recipe',
           'plan_recipe']

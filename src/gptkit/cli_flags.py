"""Command-line flags from typed dataclasses, and config files (YAML or JSON) for the same fields.

Every command's flags are generated from the dataclass its library function takes: its fields become
the flags, their ``help`` metadata the ``--help`` text, their defaults the defaults shown. Nested
dataclasses become dotted flags (``--optim.lr``); a config file's nested sections map onto them, and
flags override the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _base_type(annotation):
    """(python type, choices, container) of a field annotation such as ``int | None``,
    ``Literal[...]`` or ``tuple[str, ...]``; container is list, tuple or None (one value)."""
    origin = get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        annotation = next(a for a in get_args(annotation) if a is not type(None))
        origin = get_origin(annotation)
    if origin in (list, tuple):  # list[str], tuple[str, ...]: several values of one type
        kind, choices, _ = _base_type(get_args(annotation)[0])
        return kind, choices, origin
    if origin is Literal:
        choices = list(get_args(annotation))
        return type(choices[0]), choices, None
    return annotation, None, None


def _default(f: dataclasses.Field) -> Any:
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _help(text: str, default: Any) -> str:
    # argparse %-formats help strings: a literal % must be doubled.
    text = text.replace("%", "%%")
    if "(default" in text or "(required)" in text or default is dataclasses.MISSING:
        return text
    shown = "none" if default is None or default == () or default == [] else default
    return f"{text} (default: {shown})"


def _nested_view(
    f: dataclasses.Field, only: set[str] | None, helps: dict[str, str]
) -> tuple[set[str] | None, dict[str, str]]:
    """Which flags the nested config of field ``f`` shows, and their help texts: a command that
    names the field (or shows every flag) leaves the choice to the field's own ``flags`` metadata
    (None: all); the containing command's ``field_help`` wins over the field's."""
    if only is None or f.name in only:
        own = f.metadata.get("flags")
        only = None if own is None else set(own)
    return only, {**f.metadata.get("field_help", {}), **helps}


class _DeprecatedFlag(argparse.Action):
    """An old spelling of a flag, kept for scripts: it says so on stderr, then sets the new one
    (a switch without a value, ``--greedy``, sets its ``const``)."""

    def __init__(self, option_strings, dest, new_flag: str, **options):
        super().__init__(option_strings, dest, **options)
        self.new_flag = new_flag

    def __call__(self, parser, namespace, values, option_string=None):
        print(f"{option_string} is deprecated: use {self.new_flag}", file=sys.stderr)
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)


def _flag_options(
    f: dataclasses.Field, hint: Any, dest: str, default: Any, help: str | None
) -> tuple[bool, dict[str, Any]]:
    """(whether the flag takes a list, argparse's options for the flag of field ``f``): its type and
    choices, help (the command's words ``help``, else the field's) with the default, how many values."""
    kind, choices, container = _base_type(hint)
    is_list = container is not None
    text = help if help is not None else f.metadata.get("help", "")
    options: dict[str, Any] = {"help": _help(text, default), "default": None}
    if kind is bool:
        options["action"] = argparse.BooleanOptionalAction
    else:
        options.update(type=kind, choices=choices)
        if not choices:
            options["metavar"] = f.metadata.get("metavar", dest.upper())
        if is_list:
            options["nargs"] = "+" if default is dataclasses.MISSING else "*"
            if f.metadata.get("repeat"):  # --stop A --stop B
                options.update(action="append", nargs=None)
    if "replaced_by" in f.metadata:  # the field is an old flag itself: it says so when used
        options.update(action=_DeprecatedFlag, new_flag=_flag(f.metadata["replaced_by"]))
    return is_list, options


def _add_old_spellings(group, f: dataclasses.Field, dest: str, options: dict[str, Any]) -> None:
    """The field's deprecated flags, hidden, and its deprecated switches (a flag without a value
    that sets one), each warning when used."""
    for old in f.metadata.get("deprecated", ()):
        hidden = {**options, "help": argparse.SUPPRESS, "action": _DeprecatedFlag}
        group.add_argument(_flag(old), dest=dest, new_flag=_flag(dest), **hidden)
    for old, value in f.metadata.get("deprecated_switches", {}).items():
        new_flag = f"{_flag(dest)} {value:g}"
        group.add_argument(
            _flag(old), dest=dest, action=_DeprecatedFlag, nargs=0, const=value, default=None,
            new_flag=new_flag, help=f"Deprecated spelling of {new_flag}.",
        )  # fmt: skip


def add_dataclass_arguments(
    parser: argparse.ArgumentParser,
    cls,
    defaults: Any = None,
    *,
    only: set[str] | None = None,
    helps: dict[str, str] | None = None,
    prefix: str = "",
    config_file: bool = False,
    description: str | None = None,
) -> None:
    """One flag per field of ``cls`` (positional where the field's metadata says so), its default
    taken from the ``defaults`` instance when one is given. A field that is itself a config
    (``FinetuneConfig.training``, ``ServeConfig.limits``) contributes its fields' flags under their
    own names (after the nested class's ``flag_prefix``: LoRAConfig.rank is ``--lora-rank``), with the
    defaults of the field's default instance: the command's defaults, which may differ from the nested
    class's own. The nesting field's metadata may narrow and reword them: ``flags``, the flag names
    (without dashes) the command shows, a nested field's name showing all of it; ``field_help``, a
    help text per flag name, in the command's words; ``help``, the group's description.

    A field's metadata may say more: ``cli=False``, no flag; ``deprecated``, old flags that still set
    it, hidden, with a warning; ``deprecated_switches``, old flags without a value that set it to one
    (``--greedy``: ``--temperature 0``); ``replaced_by``, the field is itself an old flag, shown, that
    warns when used. With ``config_file`` (the command takes ``--config FILE``) a required field's
    flag may be left out, since the file may give it: :func:`dataclass_from_args` checks it."""
    hints = typing.get_type_hints(cls)
    prefix += getattr(cls, "flag_prefix", "")
    helps = helps or {}
    group = None
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        default = _default(f) if defaults is None else getattr(defaults, f.name)
        if dataclasses.is_dataclass(hints[f.name]):
            nested_only, nested_helps = _nested_view(f, only, helps)
            add_dataclass_arguments(
                parser, hints[f.name], defaults=default, only=nested_only, helps=nested_helps,
                prefix=prefix, config_file=config_file, description=f.metadata.get("help"),
            )  # fmt: skip
            continue
        dest = prefix + f.name
        if only is not None and dest not in only:
            continue
        if group is None:  # made at the first flag: a config whose flags are all hidden shows no group
            text = description or (cls.__doc__ or "").split("\n\n")[0]
            group = parser.add_argument_group(cls.__name__, text)
        required = default is dataclasses.MISSING
        is_list, options = _flag_options(f, hints[f.name], dest, default, helps.get(dest))
        if f.metadata.get("positional"):
            options.pop("default")
            if not required:
                options["nargs"] = "?" if not is_list else "*"
            group.add_argument(dest, **options)
            continue
        group.add_argument(_flag(dest), dest=dest, required=required and not config_file, **options)
        _add_old_spellings(group, f, dest, options)


def flag_names(cls, only: set[str] | None = None, prefix: str = "") -> list[str]:
    """The flag names (without dashes) that :func:`add_dataclass_arguments` makes for ``cls``: the
    names a config file may set."""
    hints = typing.get_type_hints(cls)
    prefix += getattr(cls, "flag_prefix", "")
    names: list[str] = []
    for f in dataclasses.fields(cls):
        if not f.metadata.get("cli", True):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            names += flag_names(hints[f.name], _nested_view(f, only, {})[0], prefix)
        elif only is None or prefix + f.name in only:
            names.append(prefix + f.name)
    return names


def dataclass_from_args(
    cls,
    args: argparse.Namespace,
    file_values: dict[str, Any] | None = None,
    defaults: Any = None,
    *,
    only: set[str] | None = None,
    prefix: str = "",
    source: str = "config file",
):
    """Defaults (the ``defaults`` instance's values, when given), then values from the config file
    (by flag name: :func:`flag_names`; ``source`` names the file in errors), then explicit flags. A
    field that is itself a config is built the same way, from its default instance: the containing
    config's default for that field, which may differ from the nested class's own defaults."""
    fields = dataclasses.fields(cls)
    values = {} if defaults is None else {f.name: getattr(defaults, f.name) for f in fields}
    file_values = file_values or {}
    hints = typing.get_type_hints(cls)
    prefix += getattr(cls, "flag_prefix", "")
    from_file: set[str] = set()  # fields whose value the file gave
    for f in fields:
        if not f.metadata.get("cli", True):
            continue
        if dataclasses.is_dataclass(hints[f.name]):
            start = values.get(f.name, _default(f))
            values[f.name] = dataclass_from_args(
                hints[f.name], args, file_values, defaults=None if start is dataclasses.MISSING else start,
                only=_nested_view(f, only, {})[0], prefix=prefix, source=source,
            )  # fmt: skip
            continue
        dest = prefix + f.name
        if only is not None and dest not in only:
            continue
        value = getattr(args, dest, None)
        if value is None and dest in file_values:
            value = _file_value(hints[f.name], file_values[dest], f"{source}: {dest}")
            from_file.add(f.name)
            if value is None:  # null in the file: none, even where the default is something
                values[f.name] = None
                continue
        if value is not None:
            values[f.name] = tuple(value) if _base_type(hints[f.name])[2] is tuple else value
        elif f.name not in values and _default(f) is dataclasses.MISSING:
            # Only a command with --config FILE gets here: its parser lets the flag be left out.
            flag = _flag(dest)
            raise ValueError(
                f"{cls.__name__}.{f.name} ({flag}): is required: give {flag}, or {dest} in --config FILE"
            )
    try:
        return cls(**values)
    except ValueError as e:
        # A value the file gave failed the config's own checks (``Class.field (--flag): ...``).
        if any(str(e).startswith(f"{cls.__name__}.{name} ") for name in from_file):
            raise ValueError(f"{source}: {e}") from e
        raise


def _file_value(annotation: Any, value: Any, where: str) -> Any:
    """A config file's value for a field annotated ``annotation``, as the flag would have parsed it:
    of the field's type (an integer is a number too), one of its choices, a list of them for a
    list field; otherwise a ValueError that says ``where`` (the file and the field)."""
    kind, choices, container = _base_type(annotation)
    if value is None:
        if type(None) in get_args(annotation):
            return None
        raise ValueError(f"{where}: must have a value, not null")
    if container is not None:
        if not isinstance(value, list):
            raise ValueError(f"{where}: expected a list, got {_shown(value)}")
        return [_one_file_value(kind, choices, item, where) for item in value]
    return _one_file_value(kind, choices, value, where)


def _one_file_value(kind: type, choices: list | None, value: Any, where: str) -> Any:
    expected = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(kind)
    # What the flag would read from the same characters: YAML reads 1e-3 as a string (its floats
    # need a dot), and 90 where a duration belongs as a number.
    if kind in (int, float) and isinstance(value, str):
        try:
            value = kind(value)
        except ValueError:
            pass
    elif kind is str and isinstance(value, (int, float)) and not isinstance(value, bool):
        value = str(value)
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if expected is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
        raise ValueError(f"{where}: expected {expected}, got {_shown(value)}")
    if choices and value not in choices:
        raise ValueError(f"{where}: must be one of {', '.join(map(str, choices))}, got {_shown(value)}")
    return value


def _shown(value: Any) -> str:
    """A value as an error shows it: on one line, and short."""
    text = " ".join(repr(value).split())
    return text if len(text) <= 60 else text[:57] + "..."


def read_config_file(path: str | None) -> dict[str, Any]:
    """A YAML or JSON file of fields; sections named after the config classes may group them."""
    if not path:
        return {}
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{path}: not UTF-8 text (byte {e.start})") from e
    try:
        if path.endswith((".yaml", ".yml")):
            data = _read_yaml(path, text)
        else:
            try:
                data = json.loads(text)
            except json.JSONDecodeError as e:
                raise ValueError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from e
    except RecursionError as e:
        raise ValueError(f"{path}: nested too deeply to be a config file") from e
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of field names to values")
    return data


def _read_yaml(path: str, text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text) or {}
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
        problem = getattr(e, "problem", None) or str(e)
        raise ValueError(f"{path}: not valid YAML ({where}{' '.join(str(problem).split())})") from e


def _prefixes(cls) -> dict[str, str]:
    """The flag prefix of each nested config field of ``cls`` that has one ({"lora": "lora_"})."""
    hints = typing.get_type_hints(cls)
    prefixes: dict[str, str] = {}
    for f in dataclasses.fields(cls):
        if dataclasses.is_dataclass(hints[f.name]):
            if getattr(hints[f.name], "flag_prefix", ""):
                prefixes[f.name] = hints[f.name].flag_prefix
            prefixes.update(_prefixes(hints[f.name]))
    return prefixes


def _flatten(data: dict[str, Any], prefixes: dict[str, str], prefix: str = "") -> dict[str, Any]:
    """A config file's values by flag name: sections ({"train": {...}}) and nested configs
    ({"model": {...}}, {"lora": {"rank": 4}} as ``dataclasses.asdict`` writes them) opened, at any
    depth, a nested config's keys given its flag prefix (``lora_rank``) unless they carry it."""
    flat: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            raise ValueError(f"field names are strings, not {_shown(key)}")
        if isinstance(value, dict):
            flat.update(_flatten(value, prefixes, prefix + prefixes.get(key, "")))
        else:
            flat[key if key.startswith(prefix) else prefix + key] = value
    return flat


def split_file_values(data: dict[str, Any], *classes, source: str = "config file") -> list[dict[str, Any]]:
    """Route flat or sectioned ({"train": {...}}) config-file values to each dataclass, by the flag
    names it makes; ``source`` names the file in errors."""
    try:
        flat = _flatten(data, {k: v for cls in classes for k, v in _prefixes(cls).items()})
    except ValueError as e:
        raise ValueError(f"{source}: {e}") from e
    out, claimed = [], set()
    for cls in classes:
        names = set(flag_names(cls))
        out.append({k: v for k, v in flat.items() if k in names})
        claimed |= names
    unknown = sorted(set(flat) - claimed)
    if unknown:
        raise ValueError(f"{source}: unknown field(s): {', '.join(map(_shown, unknown))}")
    return out

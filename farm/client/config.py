"""Which head the CLI and the SDK talk to: named profiles in a TOML file, the environment, or the local head.

    # ~/.config/farm/config.toml (FARM_CONFIG names another file)
    profile = "lab"                     # used when no --profile, --head or FARM_HEAD says otherwise
    [profiles.lab]
    address = "lab.example.org:7700"
    token_file = "~/.config/farm/lab.token"   # the head's API token (`api_token` in its head.json)
    ca_file = "~/.config/farm/lab-ca.pem"     # the head's tls/ca.pem

Read through pydantic-settings: the environment (FARM_HEAD, FARM_TOKEN, FARM_TOKEN_FILE, FARM_CA, FARM_INSECURE,
FARM_PROFILE) overrides the file. Which head, first match wins: `--head`, `--profile`, FARM_HEAD, FARM_PROFILE or the
file's `profile` (set only by `farm profile add --default` or `farm profile use`), else the head running from the
local state folder (FARM_STATE_DIR, default ~/.farm).
"""

from __future__ import annotations

import os
import re
import stat
import sys
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict, TomlConfigSettingsSource

from farm.core.errors import UserError

PROFILE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$")
ADDRESS = re.compile(r"^[^\s:/]+:\d{1,5}$|^\[[0-9A-Fa-f:.]+\]:\d{1,5}$")


def config_path() -> Path:
    if os.environ.get("FARM_CONFIG"):
        return Path(os.environ["FARM_CONFIG"]).expanduser()
    home = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
    return home / "farm" / "config.toml"


class Profile(BaseModel):
    """One head: where it is and the files that hold its API token and its CA certificate (paths, never secrets)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    address: str
    token_file: Path | None = None
    ca_file: Path | None = None  # None with TLS: the system's roots (a head behind a public certificate)
    insecure: bool = False  # a head started with --insecure (or behind something that terminates TLS for it)

    @field_validator("address")
    @classmethod
    def _address(cls, value: str) -> str:
        if not ADDRESS.match(value):
            raise ValueError(f"{value!r} is not HOST:PORT")
        return value


class FarmConfig(BaseSettings):
    """The file's profiles and default, and the environment's overrides."""

    model_config = SettingsConfigDict(env_prefix="FARM_", extra="ignore", frozen=True)

    profile: str | None = None  # the profile used by default (FARM_PROFILE)
    profiles: dict[str, Profile] = Field(default_factory=dict)
    head: str | None = None  # FARM_HEAD: HOST:PORT
    token: str | None = Field(default=None, repr=False)  # FARM_TOKEN
    token_file: Path | None = None  # FARM_TOKEN_FILE
    ca: Path | None = None  # FARM_CA
    insecure: bool = False  # FARM_INSECURE=1

    @classmethod
    def settings_customise_sources(
        cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource, dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, env_settings, TomlConfigSettingsSource(settings_cls, toml_file=config_path())

    @classmethod
    def load(cls) -> FarmConfig:
        """The configuration, or one line saying what is wrong with the file or the environment."""
        path = config_path()
        try:
            return cls()
        except tomllib.TOMLDecodeError as exc:
            raise UserError(f"{path}: not valid TOML: {exc}") from None
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise UserError(f"{path} (or FARM_*): {where}: {first['msg']}") from None

    def named(self, name: str) -> Profile:
        if name not in self.profiles:
            known = ", ".join(sorted(self.profiles)) or "none"
            raise UserError(f"no profile {name!r} in {config_path()} (profiles: {known}); add one with "
                            "`farm profile add NAME --head HOST:PORT --token-file FILE --ca-file FILE`")
        return self.profiles[name]


def read_secret_file(path: Path, what: str) -> str:
    """A token from a file; a file others may read gets a one-line warning on stderr, as ssh warns of a key (the
    token in it is theirs too)."""
    try:
        with path.expanduser().open() as handle:
            mode = os.fstat(handle.fileno()).st_mode
            text = handle.read().strip()
    except OSError as exc:
        raise UserError(f"cannot read {what} {path}: {exc.strerror}") from None
    if mode & 0o077:
        print(f"warning: {what} {path} is readable by other users (mode {stat.S_IMODE(mode):04o}): anyone who can "
              f"read it holds the token; chmod 600 {path}", file=sys.stderr)
    if not text:
        raise UserError(f"{what} {path} is empty")
    return text


def save_profile(name: str, profile: Profile, make_default: bool = False) -> Path:
    """Add (or replace) a profile in the config file, keeping the rest of it; the file is the user's alone."""
    if not PROFILE_NAME.match(name):
        raise UserError(f"profile name {name!r}: letters, digits, '.', '_' and '-', at most 63")
    path = config_path()
    data = _read_file(path)
    data.setdefault("profiles", {})[name] = profile.model_dump(mode="json", exclude_none=True, exclude_defaults=True)
    if make_default:  # never silently: a default profile takes over every command that names no head
        data["profile"] = name
    _write_file(path, data)
    return path


def remove_profile(name: str) -> Path:
    path = config_path()
    data = _read_file(path)
    if name not in data.get("profiles", {}):
        raise UserError(f"no profile {name!r} in {path}")
    del data["profiles"][name]
    if data.get("profile") == name:
        del data["profile"]
    _write_file(path, data)
    return path


def set_default(name: str) -> Path:
    FarmConfig.load().named(name)
    path = config_path()
    data = _read_file(path)
    data["profile"] = name
    _write_file(path, data)
    return path


def _read_file(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except FileNotFoundError:
        return {}
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc}") from None


def _write_file(path: Path, data: dict[str, Any]) -> None:
    import tomli_w

    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        tomli_w.dump(data, handle)
    os.replace(temporary, path)

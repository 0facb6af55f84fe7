"""The vocabulary the daemon holds: the config's (`vocabulary`: the home file, `names`, `terms`)
merged with Home Assistant's latest names (`homeassistant`), the config's first.

    source = VocabularySource(cfg.vocabulary, cfg.homeassistant)   # or VocabularySource.from_config(cfg)
    source.current()                # any thread: a frozen Vocabulary
    source.reload(new.vocabulary)   # SIGHUP: the home file read again; raises, keeping the old, when bad
    source.close()

Construction reads the home file and the token file and fails as the daemon should (a missing
file 66, a bad one 78, no websockets 69); Home Assistant itself is read on its own thread, and
while it cannot be, the config's vocabulary is all there is.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from edgeasr.home.homeassistant import HomeAssistantNames
from edgeasr.home.names import vocabulary_from_config
from edgeasr.stages import Vocabulary

if TYPE_CHECKING:
    from edgeasr.config import Config, HomeAssistantApiConfig, VocabularyConfig


class VocabularySource:
    def __init__(self, vocabulary: VocabularyConfig, homeassistant: HomeAssistantApiConfig, *,
                 start: bool = True) -> None:
        """`start`: begin fetching Home Assistant's names at once (else call start())."""
        self._lock = threading.Lock()
        self._own = vocabulary_from_config(vocabulary)
        self.homeassistant = HomeAssistantNames.from_config(homeassistant)
        if start:
            self.start()

    @classmethod
    def from_config(cls, cfg: Config, *, start: bool = True) -> VocabularySource:
        return cls(cfg.vocabulary, cfg.homeassistant, start=start)

    def start(self) -> None:
        if self.homeassistant is not None:
            self.homeassistant.start()

    def current(self) -> Vocabulary:
        """The config's vocabulary, then Home Assistant's latest names (each name once)."""
        with self._lock:
            own = self._own
        if self.homeassistant is None:
            return own
        return own.merged(self.homeassistant.current())

    def reload(self, vocabulary: VocabularyConfig) -> bool:
        """SIGHUP: the `vocabulary` section as it is now, its home file read again; True when the
        vocabulary changed. A bad or missing file raises (ConfigError, MissingInputError) and the
        running vocabulary stays. (`homeassistant.*` needs a restart.)"""
        new = vocabulary_from_config(vocabulary)
        with self._lock:
            changed, self._own = new != self._own, new
        return changed

    def close(self) -> None:
        if self.homeassistant is not None:
            self.homeassistant.close()

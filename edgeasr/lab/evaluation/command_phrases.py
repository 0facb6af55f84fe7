"""What a command set says in each language: its groups, espeak-ng's voices, the short commands,
speech that is not a command, and commands as people most often say them."""

from __future__ import annotations

from dataclasses import dataclass

from edgeasr.errors import UsageError

# each group's share of the set: the templates' sentences by each kind of voice, clean and at
# 10 and 20 dB SNR; short commands; speech that is not a command
GROUPS = {"piper": 2, "espeak": 2, "piper-noise10": 1, "piper-noise20": 1, "espeak-noise10": 1,
          "espeak-noise20": 1, "short": 2, "other": 2}
# the same shares without piper: espeak-ng says what piper and espeak-ng share in English
ESPEAK_GROUPS = {"espeak": 4, "espeak-noise10": 2, "espeak-noise20": 2, "short": 2, "other": 2}
# the templates' spellings for transcripts without apostrophes, which a reference does not use
UNWRITTEN = frozenset({"whats", "hows", "wheres", "todays"})
ESPEAK_VOICES = ("en-us", "en-gb", "en-us+f3", "en+m3", "en-gb-scotland", "en-us+f4")
SHORT_COMMANDS = ("pause", "next", "stop", "timer status", "pause timer", "resume timer", "cancel timer",
                  "volume up", "volume down", "mute", "unmute", "unpause", "resume", "skip", "never mind")
NOT_COMMANDS = (
    "what is the capital of France", "remind me to buy oat milk and bread",
    "the quick brown fox jumps over the lazy dog", "how far away is the moon", "who wrote pride and prejudice",
    "tell me a joke about penguins", "write an email to Sarah saying I will be late",
    "how many cups are in a gallon", "my sister is coming over for dinner on Friday",
    "what should I cook with leftover rice", "the meeting moved to half past three",
    "please take a note that the plumber called", "why is the sky blue",
    "I think I left the kitchen lights on last night", "how do you spell necessary",
    "what's the population of Canada", "send a message to mom that I'm on my way",
    "she sells sea shells by the sea shore", "can you recommend a good science fiction book",
    "we ran out of coffee filters again", "how long do I boil an egg", "translate good morning into Spanish",
    "the train to Boston leaves at seven", "who won the world cup in two thousand fourteen",
    "it was a bright cold day in April",
)
GERMAN_SHORT = ("pause", "stopp", "weiter", "nächster", "Timer Status", "Timer pausieren", "Timer fortsetzen",
                "Timer abbrechen", "lauter", "leiser", "stumm", "Ton an", "fortsetzen", "vergiss es", "egal")
GERMAN_NOT_COMMANDS = (
    "was ist die Hauptstadt von Frankreich", "erinnere mich daran Hafermilch und Brot zu kaufen",
    "der schnelle braune Fuchs springt über den faulen Hund", "wie weit ist der Mond entfernt",
    "wer hat Faust geschrieben", "erzähl mir einen Witz über Pinguine",
    "schreib eine E-Mail an Sarah dass ich mich verspäte", "wie viele Gramm hat ein Pfund",
    "meine Schwester kommt am Freitag zum Abendessen", "was soll ich mit übrig gebliebenem Reis kochen",
    "das Treffen wurde auf halb vier verschoben", "bitte notiere dass der Klempner angerufen hat",
    "warum ist der Himmel blau", "ich glaube ich habe gestern Abend das Licht in der Küche angelassen",
    "wie schreibt man notwendig", "wie viele Einwohner hat Kanada",
    "schick Mama eine Nachricht dass ich unterwegs bin", "Fischers Fritz fischt frische Fische",
    "kannst du mir ein gutes Buch empfehlen", "wir haben schon wieder keine Kaffeefilter mehr",
    "wie lange kocht man ein Ei", "übersetze guten Morgen ins Spanische", "der Zug nach Hamburg fährt um sieben",
    "wer hat die Weltmeisterschaft zweitausendvierzehn gewonnen", "es war ein heller kalter Tag im April",
)
FRENCH_SHORT = ("pause", "suivant", "précédent", "plus fort", "moins fort", "monte le son", "baisse le son",
                "sourdine", "coupe le son", "remets le son", "tais-toi", "annule", "chanson suivante",
                "annule le minuteur", "reprends le minuteur")
FRENCH_NOT_COMMANDS = (
    "quelle est la capitale de l'Allemagne", "rappelle-moi d'acheter du lait d'avoine et du pain",
    "le renard brun rapide saute par-dessus le chien paresseux", "à quelle distance se trouve la lune",
    "qui a écrit les misérables", "raconte-moi une blague sur les pingouins",
    "écris un mail à Sarah pour dire que je serai en retard", "combien de grammes dans une livre",
    "ma sœur vient dîner vendredi soir", "que puis-je cuisiner avec du riz qui reste",
    "la réunion a été déplacée à quinze heures trente", "note que le plombier a appelé",
    "pourquoi le ciel est-il bleu", "je crois que j'ai laissé la lumière de la cuisine allumée hier soir",
    "comment écrit-on nécessaire", "quelle est la population du Canada",
    "envoie un message à maman pour dire que je suis en route", "les chaussettes de l'archiduchesse sont-elles sèches",
    "peux-tu me conseiller un bon livre de science-fiction", "nous n'avons plus de filtres à café",
    "combien de temps faut-il pour cuire un œuf", "traduis bonjour en espagnol",
    "le train pour Lyon part à sept heures", "qui a gagné la coupe du monde en deux mille dix-huit",
    "c'était une belle journée froide d'avril",
)

SPANISH_SHORT = ("pausa", "siguiente", "para", "sube el volumen", "baja el volumen", "quita el silencio", "continúa",
                 "reanuda", "cancela el temporizador", "pausa el temporizador", "reanuda el temporizador",
                 "estado del temporizador", "siguiente canción", "olvídalo", "cancelar")
SPANISH_NOT_COMMANDS = (
    "cuál es la capital de Francia", "recuérdame comprar leche de avena y pan",
    "el veloz murciélago hindú comía feliz cardillo y kiwi", "a qué distancia está la luna",
    "quién escribió don quijote", "cuéntame un chiste de pingüinos",
    "escribe un correo a Sara diciendo que llegaré tarde", "cuántos gramos tiene una libra",
    "mi hermana viene a cenar el viernes", "qué puedo cocinar con el arroz que sobró",
    "la reunión se ha movido a las tres y media", "apunta que ha llamado el fontanero",
    "por qué el cielo es azul", "creo que anoche me dejé la luz de la cocina encendida",
    "cómo se escribe necesario", "cuántos habitantes tiene Canadá",
    "manda un mensaje a mamá diciendo que ya voy", "tres tristes tigres tragaban trigo en un trigal",
    "me recomiendas un buen libro de ciencia ficción", "se nos han vuelto a acabar los filtros de café",
    "cuánto tiempo se cuece un huevo", "traduce buenos días al inglés",
    "el tren a Sevilla sale a las siete", "quién ganó el mundial de dos mil diez",
    "era un día de abril claro y frío",
)
ITALIAN_SHORT = ("pausa", "successivo", "alza il volume", "abbassa il volume", "togli il muto", "riprendi",
                 "annulla il timer", "metti in pausa il timer", "riprendi il timer", "prossima canzone",
                 "brano successivo", "lascia perdere")
ITALIAN_NOT_COMMANDS = (
    "qual è la capitale della Francia", "ricordami di comprare latte di avena e pane",
    "la volpe marrone salta sopra il cane pigro", "quanto è lontana la luna",
    "chi ha scritto i promessi sposi", "raccontami una barzelletta sui pinguini",
    "scrivi una mail a Sara per dire che sono in ritardo", "quanti grammi ci sono in una libbra",
    "mia sorella viene a cena venerdì", "cosa posso cucinare con il riso avanzato",
    "la riunione è stata spostata alle tre e mezza", "prendi nota che ha chiamato l'idraulico",
    "perché il cielo è blu", "credo di aver lasciato accesa la luce in cucina ieri sera",
    "come si scrive necessario", "quanti abitanti ha il Canada",
    "manda un messaggio alla mamma che sto arrivando", "sopra la panca la capra campa",
    "mi consigli un buon libro di fantascienza", "abbiamo di nuovo finito i filtri del caffè",
    "quanto tempo ci vuole per cuocere un uovo", "traduci buongiorno in inglese",
    "il treno per Milano parte alle sette", "chi ha vinto i mondiali del duemilasei",
    "era una giornata di aprile limpida e fredda",
)
DUTCH_SHORT = ("pauze", "pauzeer", "volgende", "vorige", "stop", "volume omhoog", "volume omlaag", "dempen", "hervat",
               "timer annuleren", "timer pauzeren", "timer hervatten", "laat maar", "annuleer", "stop de timer")
DUTCH_NOT_COMMANDS = (
    "wat is de hoofdstad van Frankrijk", "herinner me eraan havermelk en brood te kopen",
    "de snelle bruine vos springt over de luie hond", "hoe ver weg is de maan",
    "wie heeft de avonden geschreven", "vertel me een mop over pinguïns",
    "schrijf een mail aan Sara dat ik later kom", "hoeveel gram zit er in een pond",
    "mijn zus komt vrijdag eten", "wat kan ik koken met de overgebleven rijst",
    "de vergadering is verplaatst naar half vier", "noteer dat de loodgieter heeft gebeld",
    "waarom is de lucht blauw", "ik denk dat ik gisteravond het licht in de keuken aan heb laten staan",
    "hoe spel je noodzakelijk", "hoeveel inwoners heeft Canada",
    "stuur mama een bericht dat ik onderweg ben", "de kat krabt de krullen van de trap",
    "kun je me een goed sciencefictionboek aanraden", "we hebben alweer geen koffiefilters meer",
    "hoe lang moet een ei koken", "vertaal goedemorgen naar het Engels",
    "de trein naar Utrecht vertrekt om zeven uur", "wie won het wereldkampioenschap in tweeduizend tien",
    "het was een heldere koude dag in april",
)

# commands as people most often say them (Home Assistant's documented example sentences), for a
# set of TTS commands of the kind people record (--everyday; the templates' sampled sentences
# are rarer phrasings). {light}: one of the home's entities of that domain; {area}: one of its
# areas. A line whose sentence Home Assistant's matcher does not find with the home (a domain
# it lacks) is not said.
EVERYDAY = (
    "turn on the {light}", "turn off the {light}", "turn on the lights in the {area}", "turn off the {area} lights",
    "set the {light} brightness to {percent} percent", "switch on the {switch}", "turn off the {switch}",
    "open the {cover}", "close the {cover}", "is the {cover} open", "lock the {lock}", "unlock the {lock}",
    "is the {lock} locked", "set the {climate} to {degrees} degrees", "what is the temperature in the {area}",
    "set the temperature to {degrees} degrees", "turn on the {fan}", "set the {fan} speed to {percent} percent",
    "pause the {media_player}", "resume the {media_player}", "set the {media_player} volume to {percent} percent",
    "next track on the {media_player}", "start the {vacuum}", "return the {vacuum} to the base",
    "activate {scene}", "run {script}", "add milk to my {todo} list", "set a timer for {minutes} minutes",
    "cancel the timer", "how much time is left on the timer", "what time is it", "what's the date today",
    "turn on the lights", "turn off all the lights",
)
EVERYDAY_NUMBERS = {"percent": (10, 20, 25, 30, 40, 50, 60, 75, 80, 100), "degrees": (18, 19, 20, 21, 22, 23, 24),
                    "minutes": (1, 2, 3, 5, 10, 15, 20, 30)}


@dataclass(frozen=True)
class Language:
    """How a set in one language is said: its groups (GROUPS, or ESPEAK_GROUPS where piper has
    no voice), espeak-ng's voices, the letters a voice says beyond SPEAKABLE's, its short
    commands (each one Home Assistant's sentences recognize) and speech that is not a command."""

    groups: tuple[tuple[str, int], ...]
    espeak_voices: tuple[str, ...]
    letters: str
    short_commands: tuple[str, ...]
    not_commands: tuple[str, ...]
    unwritten: frozenset[str] = frozenset()
    # refuse the templates' pieces joined as no one writes them: by a space after an apostrophe or
    # a hyphen ("d' interrupteurs", "sont- elles"), or glued to a name ("ObergeschossGeschoss")
    as_written: bool = True

    @property
    def voice_kinds(self) -> tuple[str, ...]:
        return tuple(k for k in VOICE_KINDS if any(g.split("-")[0] == k for g, _ in self.groups))


VOICE_KINDS = ("piper", "espeak")
LANGUAGES = {
    "en": Language(tuple(GROUPS.items()), ESPEAK_VOICES, "", SHORT_COMMANDS, NOT_COMMANDS, UNWRITTEN,
                   as_written=False),  # English sets as they always were
    "de": Language(tuple(ESPEAK_GROUPS.items()), ("de", "de+f3", "de+m3", "de+f4", "de+m1", "de+f2"), "äöüß",
                   GERMAN_SHORT, GERMAN_NOT_COMMANDS),
    # fr-be and fr-ch say numbers as Belgians and the Swiss do (septante, nonante)
    "fr": Language(tuple(ESPEAK_GROUPS.items()), ("fr", "fr+f3", "fr+m3", "fr+f4", "fr-be+m1", "fr-ch+f2"),
                   "àâæçéèêëîïôœùûüÿ", FRENCH_SHORT, FRENCH_NOT_COMMANDS),
    # es-419 says Latin America's Spanish
    "es": Language(tuple(ESPEAK_GROUPS.items()), ("es", "es+f3", "es+m3", "es+f4", "es-419+m1", "es-419+f2"),
                   "áéíóúüñ", SPANISH_SHORT, SPANISH_NOT_COMMANDS),
    "it": Language(tuple(ESPEAK_GROUPS.items()), ("it", "it+f3", "it+m3", "it+f4", "it+m1", "it+f2"),
                   "àèéìíòóù", ITALIAN_SHORT, ITALIAN_NOT_COMMANDS),
    "nl": Language(tuple(ESPEAK_GROUPS.items()), ("nl", "nl+f3", "nl+m3", "nl+f4", "nl+m1", "nl+f2"),
                   "áéëïóöü", DUTCH_SHORT, DUTCH_NOT_COMMANDS),
}

def language_of(code: str | None) -> Language:
    """The set's language for a home's `language` (en, de-CH, fr_FR; none: English)."""
    base = (code or "en").replace("_", "-").split("-")[0].lower()
    if base not in LANGUAGES:
        raise UsageError(f"no command set in language {code!r}: voices and commands are known for "
                         f"{', '.join(LANGUAGES)}")
    return LANGUAGES[base]

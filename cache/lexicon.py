"""Closed word classes the hard-negative guard relies on. General English, not tied to any data set."""


def _words(text: str) -> list[str]:
    return text.split()


FUNCTION_WORDS = frozenset(
    _words("""a an the and or but if then so of in on at to from by for with without about into onto over under
    after before between through during is are was were be been being am do does did done have has had
    can could will would shall should may might must i me my mine you your yours he him his she her hers
    it its we us our ours they them their theirs this that these those what which who whom whose when
    where why how there here any some all each every much many more most few less least very too also
    just only not no yes than as up down out off again once please ok okay hi hello hey""")
)
LEADING_VERBS = frozenset(
    _words("""explain describe tell give list write define summarize summarise compare show name help find
    calculate compute convert recommend suggest translate make create build teach let walk outline
    provide share check is are was were do does did can could should would will may might what which
    who whom whose when where why how in at on for during after before since within""")
)
NEGATIONS = frozenset(_words("not no never none nobody nothing neither nor without cannot"))
NUMBER_WORDS = {
    "zero": 0, "one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8,
    "nine": 9, "ten": 10, "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15,
    "sixteen": 16, "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30,
    "forty": 40, "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "dozen": 12,
}  # fmt: skip
MULTIPLIERS = {"hundred": 100, "thousand": 1_000, "million": 1_000_000, "billion": 1_000_000_000}
ORDINALS = {
    "first": 1, "second": 2, "third": 3, "fourth": 4, "fifth": 5, "sixth": 6, "seventh": 7, "eighth": 8,
    "ninth": 9, "tenth": 10, "eleventh": 11, "twelfth": 12, "twentieth": 20, "hundredth": 100,
    "half": 2, "quarter": 4,
}  # fmt: skip
UNITS = {
    "gram": "g", "g": "g", "kilogram": "kg", "kg": "kg", "kilo": "kg", "milligram": "mg", "mg": "mg",
    "ounce": "oz", "oz": "oz", "pound": "lb", "lb": "lb", "ton": "t", "tonne": "t", "stone": "st",
    "liter": "l", "litre": "l", "l": "l", "milliliter": "ml", "millilitre": "ml", "ml": "ml",
    "gallon": "gal", "quart": "qt", "pint": "pt", "cup": "cup", "tablespoon": "tbsp", "tbsp": "tbsp",
    "teaspoon": "tsp", "tsp": "tsp", "meter": "m", "metre": "m", "kilometer": "km", "kilometre": "km",
    "km": "km", "mile": "mi", "foot": "ft", "feet": "ft", "ft": "ft", "inch": "in", "yard": "yd",
    "centimeter": "cm", "centimetre": "cm", "cm": "cm", "millimeter": "mm", "millimetre": "mm", "mm": "mm",
    "celsius": "C", "centigrade": "C", "fahrenheit": "F", "kelvin": "K", "seconds": "s", "minute": "min",
    "hour": "h", "joule": "J", "calorie": "cal", "kilocalorie": "kcal", "kcal": "kcal", "watt": "W",
    "kilowatt": "kW", "kw": "kW", "kilowatt-hour": "kWh", "kwh": "kWh", "horsepower": "hp", "hp": "hp",
    "hz": "Hz", "hertz": "Hz", "byte": "B", "kilobyte": "KB", "kb": "KB", "megabyte": "MB", "mb": "MB",
    "gigabyte": "GB", "gb": "GB", "terabyte": "TB", "tb": "TB", "megabit": "Mbit", "gigabit": "Gbit",
    "mph": "mph", "kph": "kph", "psi": "psi", "bar": "bar", "acre": "acre", "hectare": "ha",
    "degree": "deg", "radian": "rad", "light-year": "ly", "light-minute": "lmin", "volt": "V", "amp": "A",
    "dollar": "USD", "euro": "EUR", "yen": "JPY", "percent": "%",
    "usd": "USD", "eur": "EUR", "gbp": "GBP", "jpy": "JPY", "inr": "INR", "aud": "AUD",
    "chf": "CHF", "cny": "CNY", "rmb": "CNY", "yuan": "CNY", "rupee": "INR", "rs": "INR", "sterling": "GBP",
    "quid": "GBP", "peso": "MXN", "ruble": "RUB", "rouble": "RUB", "bitcoin": "BTC", "btc": "BTC",
}  # fmt: skip
CURRENCY_SYMBOLS = {
    "$": "USD",
    "£": "GBP",
    "€": "EUR",
    "¥": "JPY",
    "₹": "INR",
    "₽": "RUB",
    "₩": "KRW",
    "₿": "BTC",
}
CURRENCY_PREFIXES = {
    "us": "USD",
    "ca": "CAD",
    "c": "CAD",
    "a": "AUD",
    "au": "AUD",
    "nz": "NZD",
    "hk": "HKD",
    "s": "SGD",
}
# "US$5" / "C$5" / "A$5": a prefix before "$" names which dollar ("won" is left out: far more often a verb)
CURRENCIES = (
    frozenset(CURRENCY_SYMBOLS.values())
    | frozenset(CURRENCY_PREFIXES.values())
    | frozenset(_words("USD EUR GBP JPY INR CAD AUD CHF CNY MXN RUB BTC KRW"))
)
TIME_WORDS = frozenset(
    _words("""today tomorrow yesterday tonight overnight now currently morning afternoon evening night noon midnight
    daytime weekday weekdays weekend weekends monday tuesday wednesday thursday friday saturday sunday
    january february march april june july august september october november december spring summer
    autumn fall winter past future minute hour day week month quarter year decade century breakfast lunch
    dinner""")
)  # relative words (next, last, early, late...) are antonym pairs instead: "last" is also a verb
_ANTONYM_PAIRS = _words("""large small larger smaller largest smallest big small bigger smaller biggest smallest
    high low higher lower highest lowest tall short taller shorter tallest shortest long short longer
    shorter longest shortest hot cold hotter colder hottest coldest warm cool heavy light heavier lighter
    heaviest lightest fast slow faster slower fastest slowest quick slow easy hard easier harder easiest
    hardest old new older newer oldest newest old young older younger oldest youngest thick thin thicker
    thinner best worst better worse good bad most least more less max min maximum minimum increase
    decrease increase reduce raise lower raise reduce gain lose buy sell add remove enable disable on off
    open close start end begin end first last before after ascending descending uppercase lowercase
    upper lower import export input output import export win lose winner loser success failure succeed
    fail rich poor cheap expensive cheapest dearest cheaper pricier safe dangerous safe unsafe legal
    illegal wet dry strong weak stronger weaker strongest weakest deep shallow wide narrow wider narrower
    early late earlier later earliest latest morning night morning evening push pull upload download
    positive negative plus minus inside outside above below top bottom north south east west left right
    future past next last next previous inbound outbound import export encrypt decrypt compress
    decompress encode decode serialize deserialize install uninstall connect disconnect lock unlock
    mount unmount include exclude allow deny accept reject friendly hostile aggressive gentle
    this previous this last this next current previous now later now then""")
ANTONYMS: dict[str, frozenset[str]] = {}
for _a, _b in zip(_ANTONYM_PAIRS[::2], _ANTONYM_PAIRS[1::2], strict=True):
    ANTONYMS[_a] = ANTONYMS.get(_a, frozenset()) | {_b}
    ANTONYMS[_b] = ANTONYMS.get(_b, frozenset()) | {_a}
RELATION_WORDS = frozenset(_words("than to from into vs versus against over before after for by in of"))
INSTRUCTION_WORDS = frozenset(
    _words("""english french spanish german italian japanese chinese portuguese russian arabic dutch korean hindi
    swedish polish turkish greek hebrew latin translate translation language json yaml xml csv markdown html
    table tables list bullet bullets bulleted numbered code block format formatted word words sentence
    sentences paragraph paragraphs brief briefly short shorter concise concisely detail detailed length
    long longer summary summarize summarise limit maximum minimum characters child children kid kids five
    year old beginner beginners expert experts student students grandmother eli5 layman simple simply poem
    haiku limerick song tweet rhyme formal informal funny joke pirate shakespeare sarcastic tone style
    source sources reference references cite citation example examples step steps reasoning diagram""")
)  # words that ask for another form of answer (language, format, length, audience, style, extras)
COURTESY_WORDS = frozenset(
    _words("""thanks thank thx cheers pls plz question quick curious wondering wonder tell know help dear kindly
    sorry bother anyone idea appreciate advance happen""")
)  # words that wrap a question without changing what it asks ("Quick question: …", "… Thanks!")
SEQUENCE_WORDS = frozenset(
    _words("""first last next previous prior latest earliest final initial second third fourth fifth 1st 2nd 3rd 4th
    5th newest most_recent""")
)  # words that pick one item of a sequence: "learn first" / "learn next" ask different things (issue 40)
AUXILIARIES = frozenset(
    _words("""is are was were am do doe does did can could should would will may might must has have had shall isn't
    aren't wasn't weren't don't doesn't didn't can't couldn't shouldn't won't""")
)  # a question that opens with one of these (and asks no wh-question) is a yes/no question

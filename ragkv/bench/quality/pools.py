"""Per-split vocabularies: `dev` and `test` share no entity, place, sentence template or question wording.

Everything is fictional, so the model cannot answer from memory. A family draws from `POOLS[split]`
only; a test checks that the two splits' pools are disjoint.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Pool:
    entities: tuple[str, ...]  # archive / station names: "the {entity} archive"
    people: tuple[str, ...]
    places: tuple[str, ...]
    kinds: tuple[str, ...]  # what an entity is: "archive", "observatory", ...
    filler: tuple[str, ...]  # prose sentences with a {place} slot
    noise: tuple[str, ...]  # RULER-style repeated noise
    doings: tuple[str, ...]  # story sentences: "{first name} {doing} in {place} {time}."
    times: tuple[str, ...]
    code_fact: tuple[str, ...]  # "{kind}", "{entity}", "{code}" slots: one fact, its answer the code
    code_question: tuple[str, ...]
    attributes: tuple[tuple[str, str, str], ...]  # (attribute, fact template, question template)
    colours: tuple[str, ...]
    pair_question: str  # {a}, {b}, {kind}: two entities in one question
    split_fact: str  # cross-chunk: ends one chunk, the code opens the next
    record: str  # {entity}, {kind}, {code}, {town}: one line of a list
    persona: str  # {person}, {entity}, {kind}, {place}
    persona_question: str
    duty: str  # {code}: a fact only the system prompt holds
    duty_question: str
    table_question: str
    code_line: str  # {key}, {code}
    config_question: str  # {key}
    passkey_needle: str  # {key}
    passkey_question: str
    assistant: str  # a plain assistant system prompt
    # dense distractors (shared_attribute, any_position, near_names): many people with the same attributes
    given_names: tuple[str, ...]
    surnames: tuple[tuple[str, ...], ...]  # groups of surnames one letter apart pairwise; [0] the plain one
    labels: tuple[str, ...]  # one-word values an attribute can take (the answer when it is a word)
    number_attribute: tuple[str, str]  # (fact, question), {person} and {value} slots: a 5-digit number
    name_attribute: tuple[str, str]  # the same, the value a label
    item_fact: tuple[str, str]  # (fact, question), {item} (a serial like "KX-4172") and {value} (a label)
    item_prefixes: tuple[str, ...]  # serials are PREFIX-DDDD
    profile: tuple[str, ...]  # side sentences about a person, {person} and {place} slots


DEV = Pool(
    entities=("Heron", "Basalt", "Marigold", "Thistle", "Cobalt", "Juniper", "Quarry", "Lantern", "Saffron",
              "Willow", "Ember", "Falcon", "Garnet", "Harbor", "Indigo", "Jasper", "Kestrel", "Linden"),
    people=("Maren Oddvik", "Tobias Quell", "Ines Farrow", "Ludo Brask", "Petra Saelen", "Amos Vey",
            "Hedda Lorne", "Caspar Mill", "Oona Treve", "Silas Dunmore"),
    places=("Pellingham", "Two Fords", "Karsk", "Holt", "Grauden", "Sels", "Marrow Point", "Veyl"),
    kinds=("archive", "observatory", "depot"),
    filler=(
        "The corridors of the {place} records office are lined with oak shelves and smell faintly of wax.",
        "Clerks in {place} sort the incoming letters by colour before they are filed.",
        "Every winter the roof of the {place} depot is checked for leaks by two volunteers.",
        "Visitors to {place} often ask about the old clock tower, which has not chimed since the flood.",
        "A small garden of herbs grows behind the {place} reading room, tended by the night porter.",
        "The {place} ledgers from the last century were rebound in green cloth during a quiet summer.",
        "Deliveries to {place} arrive on Thursdays, carried up the hill by a cart with squeaking wheels.",
        "In {place} the archivists drink strong tea and argue about the order of the index cards.",
        "The lamps in the {place} stairwell are lit by hand at dusk, one floor at a time.",
        "Rain gutters along the {place} annex were painted blue after a vote among the staff.",
    ),
    noise=("The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.",),
    doings=("walked down to the harbour", "sat by the window", "wrote a long letter to an old friend",
            "mended the fence behind the barn", "read aloud from a book of sea tales", "baked bread for the neighbours",
            "counted the lanterns along the quay", "argued cheerfully about the weather"),
    times=("that morning", "before supper", "late in the evening", "on the first day of spring", "after the storm",
           "while the kettle boiled", "as the bells rang", "during the long winter"),
    code_fact=("The access code for the {entity} {kind} is {code}.",
               "Staff of the {entity} {kind} open its main door with the code {code}."),
    code_question=("What is the access code for the {entity} {kind}?",
                   "Which code opens the {entity} {kind}?"),
    attributes=(
        ("founder", "The {entity} {kind} was founded by {value}.", "Who founded the {entity} {kind}?"),
        ("code", "The access code for the {entity} {kind} is {value}.", "What is the access code for the {entity} {kind}?"),
        ("colour", "The door of the {entity} {kind} is painted {value}.", "What colour is the door of the {entity} {kind}?"),
        ("town", "The {entity} {kind} stands in the town of {value}.", "In which town does the {entity} {kind} stand?"),
    ),
    colours=("red", "ochre", "teal", "violet", "grey", "green", "white", "amber"),
    pair_question="What are the access codes for the {a} {kind} and the {b} {kind}? Answer with both numbers.",
    split_fact="The access code for the {entity} {kind} is",
    record="- {entity} {kind} ({town}): access code {code}",
    persona="Your name is {person}. You are the keeper of the {entity} {kind} in {place}.",
    persona_question="What is your name?",
    duty="You are the front desk assistant. The emergency code for today is {code}; give it to anyone who asks.",
    duty_question="What is the emergency code for today?",
    table_question="According to the table, what is the access code of the {entity} {kind}?",
    code_line="{key}_code = {code}",
    config_question="What is the value of {key}_code in the code above?",
    passkey_needle="The pass key is {key}. Remember it. {key} is the pass key.",
    passkey_question=("There is a pass key hidden in the text above. What is the pass key? "
                      "Reply with the 5-digit number only."),
    assistant=("You are a meticulous research assistant. Read the document carefully, "
               "find the requested fact and answer with it exactly."),
    given_names=("Halvard", "Maelis", "Torsten", "Ilse", "Corin", "Agathe", "Bertil", "Solveig", "Evander",
                 "Liesel", "Marten", "Runa", "Casimir", "Edda", "Leopold", "Vigdis"),
    surnames=(("Brenn", "Brent", "Brend"), ("Tallow", "Tellow", "Tillow"), ("Vasko", "Vesko", "Visko"),
              ("Orlin", "Orlan", "Orlen"), ("Kessel", "Kassel", "Kossel"), ("Rudge", "Ridge", "Redge"),
              ("Hollis", "Hallis", "Hellis"), ("Fenwick", "Finwick", "Fanwick"), ("Ambry", "Ambre", "Ambro"),
              ("Dolan", "Dulan", "Dilan"), ("Skarr", "Skorr", "Skerr"), ("Merrow", "Morrow", "Murrow")),
    labels=("Bluebell", "Tinder", "Nutmeg", "Pippin", "Sorrow", "Clover", "Biscuit", "Marble", "Thimble",
            "Pepper", "Drizzle", "Moss", "Acorn", "Puddle", "Sparrow", "Toffee", "Wicket", "Bracken", "Cinnamon",
            "Fiddle", "Hopper", "Juniperberry", "Kipper", "Lark", "Muffin", "Nimbus", "Oatcake", "Pumpkin",
            "Quince", "Rascal", "Snowdrop", "Turnip"),
    number_attribute=("The staff badge of {person} carries the number {value}.",
                      "What number is on the staff badge of {person}?"),
    name_attribute=("The password chosen by {person} is {value}.", "What password did {person} choose?"),
    item_fact=("The label on crate {item} reads {value}.", "What does the label on crate {item} read?"),
    item_prefixes=("KX", "HR", "TV", "BL", "MQ", "DZ"),
    profile=("{person} moved to {place} some years ago and works the early shift.",
             "Colleagues say {person} keeps a tidy desk by the window in {place}.",
             "{person} walks to the office in {place} even when it rains."),
)

TEST = Pool(
    entities=("Sorrel", "Tamarind", "Umber", "Vesper", "Wren", "Yarrow", "Zephyr", "Alder", "Bramble", "Cinder",
              "Dune", "Elm", "Fennel", "Gorse", "Hazel", "Iris", "Kelp", "Lichen"),
    people=("Rhea Castellan", "Orrin Pike", "Yusra Halloway", "Bram Okonkwo", "Delphine Ash", "Teodor Rusk",
            "Wilma Graystone", "Nils Ferrant", "Anouk Verhey", "Quentin Bell"),
    places=("Oster Vale", "Brindlemoor", "Caddow", "Ferrowick", "Lumsk", "Ardent Bay", "Quillon", "Norra"),
    kinds=("station", "vault", "workshop"),
    filler=(
        "Fishing boats leave the harbour of {place} before dawn and return with the tide.",
        "The market square of {place} fills with stalls selling wool, cheese and copper pans.",
        "A narrow bridge of grey stone joins the two halves of {place} across the river.",
        "Children in {place} learn to swim in the cold lake below the old mill.",
        "The bakers of {place} are known for a dark rye loaf baked with caraway seeds.",
        "In spring the orchards around {place} are white with blossom for two short weeks.",
        "A ferry crosses from {place} to the islands three times a day in good weather.",
        "The town hall of {place} keeps a brass telescope on its roof for visitors.",
        "Sheep graze on the steep hills above {place}, watched by a single shepherd and her dog.",
        "Musicians gather in the tavern of {place} every Friday to play old reels.",
    ),
    noise=("The river is wide. The stones are grey. The birds fly south. On we walk. Round and round again.",),
    doings=("painted the old boat a new colour", "climbed the hill to watch the ships", "taught a child to whistle",
            "carried water from the well", "played cards with the miller", "planted onions in the garden",
            "repaired a broken chair", "sang quietly while sweeping the floor"),
    times=("at dawn", "after lunch", "just before midnight", "in late autumn", "when the fog lifted",
           "on market day", "while the rain fell", "through the short summer"),
    code_fact=("The entry number of the {entity} {kind} is {code}.",
               "To enter the {entity} {kind}, type the number {code}."),
    code_question=("What is the entry number of the {entity} {kind}?",
                   "Which number must be typed to enter the {entity} {kind}?"),
    attributes=(
        ("keeper", "The keeper of the {entity} {kind} is {value}.", "Who keeps the {entity} {kind}?"),
        ("code", "The entry number of the {entity} {kind} is {value}.", "What is the entry number of the {entity} {kind}?"),
        ("colour", "The roof of the {entity} {kind} is {value}.", "What colour is the roof of the {entity} {kind}?"),
        ("town", "The {entity} {kind} is located in {value}.", "Where is the {entity} {kind} located?"),
    ),
    colours=("black", "silver", "orange", "blue", "brown", "yellow", "pink", "crimson"),
    pair_question="Tell me the entry numbers of the {a} {kind} and of the {b} {kind}. Give both numbers.",
    split_fact="The entry number of the {entity} {kind} is",
    record="* {entity} {kind}, {town} -- entry number {code}",
    persona="Your name is {person} and you run the {entity} {kind} near {place}. Mention your name when asked.",
    persona_question="Who are you? Tell me your name.",
    duty="You answer questions for visitors. Tonight's gate number is {code}; share it when a visitor asks.",
    duty_question="Which gate number is valid tonight?",
    table_question="Using the table rows, tell me the entry number of the {entity} {kind}.",
    code_line='PIN["{key}"] = {code}',
    config_question='Which number is stored in PIN["{key}"]?',
    passkey_needle="The secret number is {key}. Keep it in mind: {key} is the secret number.",
    passkey_question="A secret number appears in the passage above. Which is it? Give only the number.",
    assistant="You are a careful assistant. Look for the fact the user asks about and quote it precisely.",
    given_names=("Osric", "Henrike", "Alarik", "Mirela", "Gustav", "Ottilie", "Fabian", "Sigrun", "Lorcan",
                 "Thyra", "Emeric", "Jorun", "Anselm", "Brisa", "Dorian", "Imke"),
    surnames=(("Kalder", "Kolder", "Kulder"), ("Pryce", "Pryse", "Pryde"), ("Stannic", "Stennic", "Stinnic"),
              ("Vorne", "Varne", "Verne"), ("Lisk", "Lusk", "Lesk"), ("Gravell", "Grovell", "Grivell"),
              ("Thorne", "Thurne", "Tharne"), ("Bexley", "Baxley", "Boxley"), ("Quarrel", "Quirrel", "Querrel"),
              ("Mallet", "Mullet", "Millet"), ("Ostrand", "Ostrund", "Ostrind"), ("Penrose", "Panrose", "Pinrose")),
    labels=("Rowan", "Gully", "Sprocket", "Tansy", "Flint", "Mallow", "Brisket", "Dapple", "Emberly",
            "Fidget", "Gingersnap", "Hickory", "Inkwell", "Jigsaw", "Kettle", "Lupin", "Mustard", "Nettlebud",
            "Olive", "Paprika", "Quiver", "Ripple", "Saddle", "Tumble", "Umbra", "Velvet", "Waffle", "Yolk",
            "Zinnia", "Barley", "Cobble", "Dumpling"),
    number_attribute=("The locker assigned to {person} has the number {value}.",
                      "Which locker number is assigned to {person}?"),
    name_attribute=("The secret word of {person} is {value}.", "Which secret word belongs to {person}?"),
    item_fact=("The tag on parcel {item} says {value}.", "Which word is written on the tag of parcel {item}?"),
    item_prefixes=("QF", "ZN", "WT", "GJ", "PX", "RC"),
    profile=("{person} grew up near {place} and still visits every summer.",
             "Neighbours in {place} know {person} for a loud laugh and a red bicycle.",
             "{person} takes the ferry from {place} on most weekdays."),
)

POOLS: dict[str, Pool] = {"dev": DEV, "test": TEST}
SPLITS = tuple(POOLS)
SPLIT_SEEDS = {"dev": 1_000, "test": 9_000}  # other seeds as well as other vocabularies

"""The training text of the default model: short children's stories and
chat exchanges that this script writes itself from a small grammar.

Every word list and sentence pattern below was written for this project, so
the text (and a model trained on it) carries no one else's licence. A story
is a plot (lost thing, fear, sharing, journey, making something, rainy day)
told with a hero, a friend, a place and an object drawn at random, each beat
of the plot said in one of several ways. Chat exchanges ask for a story with
some of those choices named ("a story about a brave fox named Rosa") and the
answer is a story that uses them, so the model learns to follow a request.

    python3 tales.py --seed 1 --count 5      # print five samples
"""

import argparse
import random

GIRLS = """Mia Lily Rosa Ana Ella Zoe Nora Ivy Ruby Lucy Maya Tess Hana Lena Sara Alma Kira Nina Jade Iris
Leah Cora Eva Mila Greta Wren Molly Daisy Amara Elin Freya Holly June Luna Pia Sofia Tara Vera Yuki""".split()
BOYS = """Tom Ben Leo Max Sam Finn Theo Noah Omar Jack Ravi Eli Hugo Luca Milo Owen Jonas Kai Arlo Ezra
Felix Ivan Jamal Kenji Liam Marco Nils Oscar Pablo Rory Tariq Victor Wes Aldo Bram Cody Dev Emil""".split()
ANIMALS = """rabbit fox bear mouse cat dog duck owl frog turtle squirrel hedgehog lamb pig goat deer
kitten puppy bunny otter badger robin pony hen tiger lion elephant monkey penguin whale dolphin""".split()
CHILDREN = ["girl", "boy"]
ADJECTIVES = """little small brave shy curious happy sleepy clever kind gentle quiet busy funny tiny
friendly careful cheerful young playful proud""".split()
# (object, how it is lost or used, colour/adjective choices)
OBJECTS = ["ball", "kite", "hat", "book", "boat", "balloon", "drum", "scarf", "shell", "stone", "cup", "spoon",
           "map", "lantern", "blanket", "bell", "teddy bear", "toy car", "paper boat", "red ball", "blue kite",
           "yellow hat", "shiny stone", "little drum", "warm scarf", "wooden spoon", "toy train", "music box",
           "picture book", "glass marble", "silver key"]
PLACES = [("the forest", "in the forest"), ("the garden", "in the garden"), ("the beach", "on the beach"),
          ("the park", "in the park"), ("the farm", "on the farm"), ("the village", "in the village"),
          ("the river", "by the river"), ("the hill", "on the hill"), ("the meadow", "in the meadow"),
          ("the pond", "by the pond"), ("the school", "at school"), ("the market", "at the market"),
          ("the lake", "by the lake"), ("the woods", "in the woods"), ("the library", "in the library"),
          ("the zoo", "at the zoo"), ("the valley", "in the valley"), ("the harbour", "at the harbour")]
HIDING = ["under a big leaf", "behind a tree", "under the bed", "next to a rock", "in a pile of leaves",
          "under a bush", "behind the door", "in the tall grass", "near the fence", "under a bench",
          "inside an old box", "by the water"]
FEARS = [("the dark", "dark"), ("the water", "water"), ("thunder", "storm"), ("big dogs", "dog"),
         ("the tall slide", "slide"), ("the deep woods", "woods"), ("loud noises", "noise"), ("bees", "bee")]
FOODS = ["apples", "berries", "carrots", "bread", "cookies", "soup", "honey", "pancakes", "nuts", "pie"]
MAKES = [("a cake", "flour, eggs and sugar", "the cake"), ("a sandcastle", "sand, water and shells", "the sandcastle"),
         ("a kite", "paper, string and sticks", "the kite"), ("a birdhouse", "wood, nails and paint", "the birdhouse"),
         ("a boat", "wood, rope and a sail", "the boat"), ("a snowman", "snow, a carrot and two stones", "the snowman"),
         ("a card", "paper, glue and crayons", "the card"), ("a hat", "cloth, thread and a button", "the hat")]
SIGHTS = ["the sea shining in the sun", "a rainbow over the hills", "a field full of flowers", "the stars in the sky",
          "a big waterfall", "the whole village below", "a nest with three little eggs", "the moon over the lake"]
# (what is wrong with the friend, what the hero does: {F} is the friend)
PROBLEMS = [("was stuck in a hole", "pulled {F} out of the hole"), ("had lost the way home", "showed {F} the way home"),
            ("could not reach the apples", "helped {F} reach the apples"),
            ("had a thorn in a paw", "took the thorn out of {F}'s paw"),
            ("was cold and wet", "gave {F} a warm blanket"), ("was very hungry", "shared some food with {F}")]
FEELINGS_GOOD = ["happy", "glad", "proud", "very happy", "so happy"]
ENDINGS = ["From that day on, {H} and {F} were best friends.", "And they played together until the sun went down.",
           "That night, {H} went to sleep with a big smile.", "{H} never forgot that day.",
           "It was the best day ever.", "And {H} learned that friends make everything better."]
OPENINGS = ["Once upon a time, there was {hero}.", "Once upon a time, {hero} lived {place_in}.",
            "One day, {hero} was playing {place_in}.", "There once was {hero} who lived {place_in}.",
            "Long ago, {hero} lived {place_in}.", "One sunny morning, {hero} woke up early."]


def article(word):
    return "an" if word[0] in "aeiou" else "a"


class Char:
    """A character: name, kind (animal or child) and pronouns."""

    def __init__(self, rng, kind=None, name=None, adj=None):
        self.kind = kind or (rng.choice(CHILDREN) if rng.random() < 0.3 else rng.choice(ANIMALS))
        girl = self.kind == "girl" or (self.kind != "boy" and rng.random() < 0.5)
        if name is None:
            name = rng.choice(GIRLS if girl else BOYS)
        elif name in GIRLS:
            girl = True
        elif name in BOYS:
            girl = False
        self.name = name
        self.adj = adj or rng.choice(ADJECTIVES)
        self.he, self.him, self.his = ("she", "her", "her") if girl else ("he", "him", "his")

    def intro(self):
        return f"{article(self.adj)} {self.adj} {self.kind} named {self.name}"


def cap(s):
    return s[0].upper() + s[1:]


def story_lost(rng, h, f, place, obj):
    pl, pin = place
    spot = rng.choice(HIDING)
    return [
        rng.choice([f"{h.name} had a favourite {obj}.", f"{h.name} loved {h.his} {obj} very much.",
                    f"{cap(h.his)} favourite thing in the world was a {obj}."]),
        rng.choice([f"Every day, {h.he} took it to {pl}.", f"{cap(h.he)} took it everywhere {h.he} went."]),
        rng.choice([f"One day, {h.name} went to {pl} and the {obj} was gone!",
                    f"But one morning, {h.name} could not find the {obj} anywhere."]),
        rng.choice([f"{h.name} looked {pin}, but it was not there.", f"{h.name} looked high and low."]),
        rng.choice([f"{cap(h.he)} felt very sad and began to cry.", f"{cap(h.he)} was so sad."]),
        f"Then {h.his} friend {f.name} the {f.kind} came by.",
        rng.choice([f"\"Why are you sad, {h.name}?\" asked {f.name}.", f"\"What is wrong?\" asked {f.name}."]),
        f"\"I lost my {obj},\" said {h.name}.",
        rng.choice([f"\"Do not worry. I will help you look,\" said {f.name}.",
                    f"\"Let us look together,\" said {f.name}."]),
        f"They looked and looked. At last, {f.name} found the {obj} {spot}.",
        rng.choice([f"\"Thank you, {f.name}!\" said {h.name}.", f"{h.name} hugged {f.name}. \"Thank you!\" {h.he} said."]),
        rng.choice(ENDINGS).format(H=h.name, F=f.name),
    ]


def story_fear(rng, h, f, place, obj):
    fear, word = rng.choice(FEARS)
    pl, pin = place
    return [
        rng.choice([f"{h.name} was afraid of {fear}.", f"{h.name} did not like {fear}. It made {h.him} scared."]),
        rng.choice([f"When {h.his} friends went to {pl}, {h.name} stayed at home.",
                    f"{cap(h.he)} always hid when {h.he} thought of {fear}."]),
        f"One day, {h.his} friend {f.name} the {f.kind} said, \"Come with me, {h.name}. I will stay with you.\"",
        rng.choice([f"{h.name} was scared, but {h.he} held {f.name}'s hand.", f"{h.name} took a deep breath."]),
        rng.choice([f"Together they went to {pl}.", f"They walked slowly to {pl}."]),
        rng.choice([f"At first, {h.name} shook a little.", f"{h.name} closed {h.his} eyes, then opened them again."]),
        rng.choice([f"But nothing bad happened. {fear[0].upper() + fear[1:]} was not so scary after all.",
                    f"Then {h.he} saw that there was nothing to be afraid of."]),
        rng.choice([f"\"I did it!\" said {h.name}.", f"\"I am not afraid anymore,\" said {h.name}."]),
        f"{f.name} smiled. \"You are very brave,\" {f.he} said.",
        rng.choice([f"{h.name} felt {rng.choice(FEELINGS_GOOD)}.", rng.choice(ENDINGS).format(H=h.name, F=f.name)]),
    ]


def story_share(rng, h, f, place, obj):
    pl, pin = place
    return [
        rng.choice([f"{h.name} got a new {obj}.", f"{h.name} had a {obj} that {h.he} loved."]),
        f"{cap(h.he)} played with it {pin} all day.",
        f"{f.name} the {f.kind} came and asked, \"Can I play with your {obj} too?\"",
        rng.choice([f"\"No, it is mine,\" said {h.name}.", f"But {h.name} did not want to share."]),
        rng.choice([f"{f.name} was sad and walked away.", f"{f.name} looked down and went home."]),
        rng.choice([f"Soon, {h.name} felt lonely. Playing alone was not fun.",
                    f"After a while, {h.name} did not feel good. {cap(h.he)} missed {h.his} friend."]),
        f"So {h.he} ran after {f.name} and said, \"I am sorry. Let us play together.\"",
        rng.choice([f"{f.name} smiled, and they played with the {obj} together.",
                    f"They took turns with the {obj} and laughed a lot."]),
        rng.choice([f"{h.name} learned that sharing is more fun than playing alone.",
                    f"Sharing made them both {rng.choice(FEELINGS_GOOD)}."]),
    ]


def story_journey(rng, h, f, place, obj):
    pl, pin = place
    sight = rng.choice(SIGHTS)
    prob, fix = rng.choice(PROBLEMS)
    food = rng.choice(FOODS)
    return [
        rng.choice([f"{h.name} wanted to see what was past {pl}.", f"{h.name} dreamed of a long trip to the top of the big hill."]),
        f"So one morning {h.he} packed some {food} and {h.his} {obj}, and off {h.he} went.",
        rng.choice([f"On the way, {h.he} met {f.intro()}.", f"After a while, {h.he} saw {f.intro()}."]),
        f"{f.name} {prob}.",
        rng.choice([f"\"Please help me,\" said {f.name}.", f"\"Can you help me?\" asked {f.name}."]),
        f"{h.name} stopped and {fix.format(F=f.name)}.",
        f"\"Thank you,\" said {f.name}. \"Can I come with you?\"",
        f"\"Yes!\" said {h.name}. So they walked on together.",
        rng.choice([f"At last, they saw {sight}.", f"When they got to the top, they saw {sight}."]),
        rng.choice([f"\"It is so beautiful,\" said {h.name}.", f"They sat down and ate the {food}."]),
        rng.choice(ENDINGS).format(H=h.name, F=f.name),
    ]


def story_make(rng, h, f, place, obj):
    thing, needs, the = rng.choice(MAKES)
    return [
        rng.choice([f"{h.name} wanted to make {thing}.", f"One day, {h.name} had an idea. {cap(h.he)} would make {thing}!"]),
        f"{cap(h.he)} needed {needs}.",
        f"{cap(h.he)} worked hard, but {the} fell apart.",
        rng.choice([f"\"Oh no,\" said {h.name}. {cap(h.he)} wanted to give up.", f"{h.name} felt sad and sat down."]),
        f"{f.name} the {f.kind} saw {h.him} and said, \"Do not give up. Try again, and I will help.\"",
        rng.choice(["So they tried again, slowly and carefully.", "This time they worked together, one step at a time."]),
        rng.choice([f"At last, {the} was done. It was the best one {h.name} had ever seen.",
                    f"Soon {the} was ready, and it looked just right."]),
        f"{h.name} was {rng.choice(FEELINGS_GOOD)}. \"We did it!\" {h.he} said.",
        rng.choice([f"{h.name} learned that it is good to keep trying.", rng.choice(ENDINGS).format(H=h.name, F=f.name)]),
    ]


def story_rain(rng, h, f, place, obj):
    pl, pin = place
    return [
        rng.choice([f"It was a rainy day, and {h.name} could not go to {pl}.",
                    f"{h.name} wanted to play {pin}, but it was raining."]),
        rng.choice([f"{cap(h.he)} looked out of the window and sighed.", f"{cap(h.he)} felt bored and a little sad."]),
        f"Then {f.name} the {f.kind} knocked on the door.",
        rng.choice([f"\"Let us build a fort with blankets!\" said {f.name}.", f"\"Let us play with your {obj}!\" said {f.name}."]),
        rng.choice(["They built a big fort and told stories inside it.", "They played and laughed all afternoon."]),
        rng.choice(["Soon the rain stopped and the sun came out.", "After a while, the rain stopped."]),
        rng.choice(["There was a big rainbow in the sky.", "The grass was wet and shiny."]),
        f"\"Rainy days can be fun too,\" said {h.name}.",
        rng.choice(ENDINGS).format(H=h.name, F=f.name),
    ]


PLOTS = {"lost": story_lost, "fear": story_fear, "share": story_share, "journey": story_journey,
         "make": story_make, "rain": story_rain}


def story(rng, hero=None, plot=None, obj=None, place=None):
    """One story as a list of sentences; hero, plot, obj, place as given or drawn."""
    h = hero or Char(rng)
    f = Char(rng)
    while f.name == h.name:
        f = Char(rng)
    place = place or rng.choice(PLACES)
    obj = obj or rng.choice(OBJECTS)
    plot = plot or rng.choice(list(PLOTS))
    opening = rng.choice(OPENINGS).format(hero=h.intro(), place_in=place[1])
    return [opening] + PLOTS[plot](rng, h, f, place, obj)


def request(rng):
    """A chat request for a story and the story that answers it."""
    form = rng.randrange(8)
    adj = rng.choice(ADJECTIVES)
    kind = rng.choice(ANIMALS + CHILDREN)
    hero = Char(rng, kind=kind, adj=adj)
    plot = obj = None
    ask = rng.choice(["Tell me a story", "Can you tell me a story", "Please tell me a story", "Write a story",
                      "Write a short story", "I want a story", "Tell me a short story"])
    end = "?" if ask.startswith("Can") else "."
    if form == 0:
        q = f"{ask} about {article(adj)} {adj} {kind}{end}"
    elif form == 1:
        q = f"{ask} about {article(kind)} {kind} named {hero.name}{end}"
    elif form == 2:
        q = f"{ask} about {hero.name}{end}"
    elif form == 3:
        obj = rng.choice(OBJECTS)
        plot = "lost"
        q = f"{ask} about {article(kind)} {kind} who lost a {obj}{end}"
    elif form == 4:
        plot = "fear"
        q = f"{ask} about being brave{end}"
    elif form == 5:
        plot = "share"
        q = f"{ask} about sharing{end}"
    elif form == 6:
        plot = "make"
        q = f"{ask} about {article(kind)} {kind} who makes something{end}"
    else:
        q = rng.choice(["Tell me a story.", "Can you tell me a story?", "Tell me a bedtime story.",
                        "I want to hear a story.", "Story, please!"])
        hero = None
    return q, " ".join(story(rng, hero=hero, plot=plot, obj=obj))


SMALL_TALK = [
    (["Hello!", "Hi!", "Hello.", "Hi there!", "Hey!", "Good morning!"],
     ["Hello! I am a small story model. Ask me for a story and I will tell you one.",
      "Hi! I like to tell short stories. What should my story be about?"]),
    (["Who are you?", "What are you?", "What is your name?"],
     ["I am TinyTales, a very small language model. I know how to tell short stories for children.",
      "My name is TinyTales. I am a tiny model that tells simple stories."]),
    (["What can you do?", "How can you help me?", "What do you know?"],
     ["I can tell short stories about animals and children. Try asking me for a story about a brave fox.",
      "I tell simple stories. Ask me for a story about a cat, a dog, or a little girl named Mia."]),
    (["Thank you!", "Thanks!", "That was nice.", "I liked that story."],
     ["You are welcome! Would you like another story?", "I am glad you liked it. Ask me for another one any time."]),
]


def chat(rng):
    """A conversation as a list of (user, assistant) turns: one to three."""
    turns = []
    for _ in range(rng.choice([1, 1, 1, 2, 3])):
        if rng.random() < 0.12:
            qs, ans = rng.choice(SMALL_TALK)
            turns.append((rng.choice(qs), rng.choice(ans)))
        else:
            turns.append(request(rng))
    return turns


def samples(seed, count):
    """count samples: ("story", text) or ("chat", [(user, assistant), ...])."""
    rng = random.Random(seed)
    for _ in range(count):
        if rng.random() < 0.5:
            yield "story", " ".join(story(rng))
        else:
            yield "chat", chat(rng)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--count", type=int, default=5)
    a = ap.parse_args()
    for kind, s in samples(a.seed, a.count):
        print(s if kind == "story" else "\n".join(f"User: {u}\nAssistant: {r}" for u, r in s))
        print()

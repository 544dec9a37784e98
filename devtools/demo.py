"""The bundled demo corpus: a seeded generator of a small realistic corpus with planted defects.

`python -m devtools.demo OUT_DIR [--seed N]` writes OUT_DIR/source/ (the corpus: .jsonl, .json in the
chinese-poetry layout, .txt blocks, .csv, one .jsonl.gz, a file raw_records skips, and web/pages.warc.gz: real
multilingual pages from tests/fixtures/web/pages as a crawler's WARC, the same for every seed) and
OUT_DIR/manifest.json, the ground truth of what was planted, so each stage's tests can score themselves.
Text is built from embedded word lists and templates (no downloads); the same seed gives byte-identical
files (the .gz is written with mtime 0; its compressed bytes still depend on the zlib build).

Manifest keys (ids are raw record ids, `tokenmill.common.io.record_id`):
  records                 number of valid records raw_records must emit
  record_kinds            {kind: count} (en_prose, en_verse, zh_poem, zh_prose, post, garbled)
  files                   {relpath: {"format", "records", "rejected"}}; skipped_files: [relpath]
  web_pages               [{"id", "url"}] the documents of web/pages.warc.gz (its request and
                          metadata records are skipped: web_skipped_records)
  rejected_raw            [{path, line, reason}] bad lines raw_records must reject
  exact_duplicates        [[id_a, id_b]] (a comes first in source order); exact_duplicate_variants adds the
                          variant: identical / whitespace / punctuation / case
  near_duplicates         [{"a", "b", "edit": "substitution"|"reorder", "edits": n}]
  boilerplate_lines       [str] header/footer lines planted at the first/last line of documents;
                          boilerplate_docs: [{"id", "lines"}]
  genuine_frequent_lines  [str] frequent lines in varied positions that must survive cleaning;
                          genuine_frequent_docs: [{"id", "line"}]
  mojibake                [{"id", "original"}]: ftfy.fix_encoding(text) == original
  garbled                 [{"id", "reason"}] reason in placeholder_glyphs, too_short (<= 8 chars), empty, repetition
  header_metadata         [{"id", "title", "author"}] records whose text starts with Title:/Author:
                          (标题：/作者：) lines
"""

from __future__ import annotations

import argparse
import csv
import gzip
import io
import json
import random
import re
import shutil
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tokenmill.common.io import atomic_write_json, record_id

DEFAULT_SEED = 20240601
GENERATOR = "devtools.demo/1"

# ------------------------------------------------------------------------------------------ word lists (en)

EN_NOUNS = (
    "river mountain meadow forest harbor valley orchard lantern sparrow willow tide ember bridge garden "
    "field shore cloud storm hill creek moor village road window candle bell tower island lake pine "
    "chapel ferry lighthouse barn kettle compass letter mirror pebble thistle heron fox owl swallow "
    "chimney ladder quarry canal well cottage hedge gate staircase attic market wharf"
).split()
EN_ADJS = (
    "quiet golden ancient restless silver hollow gentle bitter distant crimson pale wild narrow broken "
    "tender weary bright frozen sunlit misty patient lonely secret careful drowsy amber empty crooked "
    "faded humble salt-stained rusted windswept"
).split()
EN_VERBS = (
    "sleeps wanders whispers trembles burns waits sings fades rises turns drifts glows breaks lingers "
    "listens shivers settles gleams echoes dreams"
).split()
EN_TVERBS = "remember carry follow answer gather forgive count mend keep name".split()
EN_PREPS = "beneath beyond along across above beside toward within behind under".split()
EN_TIMES = (
    "at dawn",
    "in the evening",
    "before the rain",
    "after midnight",
    "in early spring",
    "through the winter",
    "at the turn of the year",
    "when the bells ring",
    "by candlelight",
    "in the long afternoon",
    "under the first frost",
    "as the tide goes out",
)
EN_FIRST = (
    "Ada Ben Clara Daniel Eleanor Felix Grace Henry Iris James Katherine Leo Margaret Nathan Olive "
    "Peter Rose Samuel Thea Victor Winifred"
).split()
EN_LAST = (
    "Ashdown Bramble Carrow Denholm Ellery Fairweather Greaves Hollins Ingram Jessop Kettering Lowell "
    "Marlowe Northcott Oakes Pennington Rowe Stanhope Thorne Underwood Vance Whitlock"
).split()
EN_TOWNS = (
    "Eastwick Harrowby Linfield Marston Netherby Oldcastle Pellham Ravensworth Southmere Thornbury Westbrook Yarrow"
).split()
EN_FOODS = "leeks carrots onions fennel mushrooms apples pears beetroot cabbage parsnips plums tomatoes".split()
EN_LIQUIDS = ("cold water", "warm milk", "cider", "vinegar", "brine", "lemon juice", "olive oil", "stock")
EN_DATASETS = (
    "a crawl of public web pages",
    "two million short stories",
    "a corpus of legal filings",
    "a mix of code and prose",
    "transcribed radio programs",
    "a collection of classical poetry",
    "scientific abstracts",
    "customer support chats",
)
EN_HW = (
    "eight GPUs",
    "a single workstation",
    "a small cluster",
    "thirty-two accelerators",
    "one laptop",
    "a borrowed server rack",
)
EN_FEATURES = (
    "sentence boundaries",
    "rhyme and meter",
    "matching brackets",
    "the subject of a verb",
    "repeated names",
    "numbers and dates",
    "quotation marks",
    "the end of a paragraph",
)

EN_VERSE_TEMPLATES = (
    "The {adj} {noun} {verb} {prep} the {noun2}",
    "{Time}, the {noun} {verb}",
    "I {tverb} the {adj} {noun} {prep} the {noun2}",
    "O {adj} {noun}, {tverb} me {time}",
    "Where the {noun} {verb}, the {noun2} {verb2}",
    "A {adj} {noun} {prep} a {adj2} {noun2}",
    "We {tverb} the {noun} and the {adj} {noun2}",
    "{Time} I {tverb} the {noun} {prep} the {adj} {noun2}",
)

EN_PROSE = {
    "walk": (
        "We set out from the {noun} {time} and followed the {adj} {noun2} toward {town}.",
        "The path was {adj} and {adj2}, and the air smelled of {food} and wet {noun}.",
        "{First} stopped at the {noun} to sketch the {adj} {noun2} {prep} the {noun3}.",
        "Nobody in {town} could remember when the {noun} had last been repaired.",
        "By {n} o'clock we had walked {n2} miles and the {noun} was still {adj}.",
        "An old farmer told us that the {noun} {verb} {prep} the {noun2} every {season}.",
        "We ate bread and {food} on a {adj} bench and watched the {noun} {verb}.",
        "The guidebook promised a {adj} view of the {noun}, and for once it was right.",
        "On the way back the {noun2} {verb2} {prep} the {adj} {noun3}, and we said very little.",
        "It is {n} miles from {town} to {town2}, most of them along the {noun}.",
    ),
    "tech": (
        "The Transformer architecture relates every token to every other token through self-attention.",
        "{First} {Last} trained a {size} Transformer on {dataset} for {n} days using {hw}.",
        "Attention heads in layer {n} of the model learned to track {feature}.",
        "The tokenizer splits the word {word} into {k} pieces, which costs {k} positions of context.",
        "A learning rate of {lr} worked best once the warmup lasted {n2} hundred steps.",
        "Most of the gain came from cleaning the data, not from a larger Transformer.",
        "The team removed {n} percent of the corpus as near duplicates before training.",
        "Evaluation on {dataset} showed that longer context helped with {feature}.",
        "Checkpoints were written every {n2} thousand steps and kept for {n} days.",
        "A small Transformer with {k} layers already predicts {feature} surprisingly well.",
        "Packing documents into fixed windows kept {hw} busy {n} percent of the time.",
    ),
    "kitchen": (
        "Slice the {food} thinly and let them rest in {liquid} for {n} minutes.",
        "My grandmother in {town} always added a pinch of salt to the {food2}.",
        "Roast the {food} until the edges are {adj}, about {n2} minutes.",
        "{First} insists that {food} taste better after the first {season} frost.",
        "Keep the {food2} in a {adj} jar on the shelf beside the {noun}.",
        "Serve it warm with {food} and a spoon of {liquid}.",
        "The recipe came from a {adj} notebook found in the {noun} of a house in {town}.",
        "If the sauce is too thin, simmer it for another {n} minutes.",
    ),
    "history": (
        "In {year}, the people of {town} built a {adj} {noun} near the {noun2}.",
        "The parish records of {town} mention the {noun} for the first time in {year}.",
        "{First} {Last}, a {trade} by trade, kept a diary from {year} to {year2}.",
        "During the flood of {year} the {noun} was the only dry place in {town}.",
        "The {noun} was rebuilt in {year2} with stone taken from the old {noun2}.",
        "Letters from {town} describe the {adj} winter of {year} in great detail.",
        "By {year2} the town had a {noun}, a {noun2} and {n} working mills.",
        "Local stories claim the {noun} {verb} {prep} the {noun2} on the night of the fair.",
    ),
}
EN_SEASONS = "spring summer autumn winter".split()
EN_TRADES = "carpenter miller weaver clerk schoolteacher blacksmith ferryman baker".split()
EN_WORDS = (
    "unbelievably",
    "counterintuitive",
    "nevertheless",
    "lighthouse",
    "thistledown",
    "overshadowed",
    "serendipity",
    "Whitlock",
)
EN_SIZES = ("small", "medium-sized", "tiny", "deep but narrow", "wide and shallow", "two-billion-parameter")

EN_POST_TEMPLATES = (
    "Has anyone tried {thing}? I {exp} and I am not sure what to do next.",
    "Quick question about {thing}: does it work on {hw}? Mine {exp}.",
    "Update: {thing} finally works. The trick was to {fix}.",
    "I spent {n} hours on {thing} today. It {exp}, but I learned a lot.",
    "Tip for anyone using {thing}: {fix} before you start, it saves time.",
)
EN_THINGS = (
    "the new tokenizer",
    "sourdough starter",
    "the river trail near Linfield",
    "a mechanical keyboard",
    "the night train to Oldcastle",
    "training a small Transformer",
    "pickling beetroot",
    "the library's old map collection",
    "restoring a rusted bicycle",
    "the community garden",
)
EN_EXPS = (
    "got stuck halfway",
    "ran out of memory twice",
    "worked on the second try",
    "made a terrible noise",
    "was much slower than expected",
    "broke in a way nobody had seen",
)
EN_FIXES = (
    "read the manual twice",
    "restart everything",
    "lower the batch size",
    "oil the chain",
    "keep it somewhere warm",
    "ask at the front desk",
)

# ------------------------------------------------------------------------------------------ word lists (zh)

ZH_WORDS = (
    "春风 明月 青山 白云 流水 孤舟 落花 寒江 夕阳 归雁 长亭 古道 西风 细雨 江南 故园 柳絮 梧桐 秋霜 "
    "残灯 远山 烟波 渔火 松涛 竹影 清泉 小桥 黄昏 晓钟 芳草 碧水 空山 征帆 寒梅 野渡 高楼 关山 塞雪 "
    "孤城 春水 秋月 落日 苍苔 疏桐 暮雨 新荷 乱石 深巷 客舍 旧友 行人 离愁 乡心 白发 浮云 归舟 "
    "花影 鸟声 溪桥 山寺 渔歌 松风 竹篱 柴门 霜林 雁阵"
).split()
ZH_VERBS = list("照落归飞满入映随送生寒远深空横斜闻望隐度过开尽动")
ZH_SURNAMES = list("李王张刘陈杨赵黄周吴徐孙胡朱高林何郭马罗梁宋郑谢韩唐冯于董萧")
ZH_GIVEN = list("白甫维然清远明山云安若之言舟川和宁翰思源晓岚")
ZH_TITLE_SUFFIX = ("吟", "行", "曲", "怀古", "送别", "夜泊", "春望", "秋思", "偶题", "寄友")
ZH_RHYTHMIC = ("浣溪沙", "菩萨蛮", "临江仙", "蝶恋花", "鹧鸪天", "西江月", "清平乐", "满江红")
ZH_EDIT_CHARS = list("山水风月花雨云天江春秋夜石松竹烟霞雪寒")

ZH_PROSE = {
    "city": (
        "{时间}，我沿着{街道}慢慢走，路边的{店铺}刚刚开门。",
        "{人物}说，这座城市最好的季节是{季节}，因为{理由}。",
        "{街道}上的{店铺}已经开了{n}年，老板每天{时间}准时营业。",
        "我们在{地点}坐了很久，看着来往的行人，谁也没有说话。",
        "城市变化得很快，可是{地点}的样子几乎没有改变。",
        "{人物}告诉我，小时候常在{地点}附近玩耍，那时{理由}。",
        "傍晚时分，{地点}的灯一盏一盏亮起来，{感受}。",
    ),
    "tech": (
        "Transformer 模型依靠自注意力机制，让每个词都能关注上下文中的其他词。",
        "{人物}用{n}张显卡训练了一个小型 Transformer 模型，前后花了{n2}天。",
        "数据清洗往往比增加模型参数更重要，去重之后效果明显提升。",
        "分词器把一个长词切成{k}个片段，这会占用更多的上下文长度。",
        "我们在{语料}上评估模型，发现它对{能力}的掌握还不稳定。",
        "学习率设为万分之{k}时，训练曲线最平稳。",
        "{人物}认为，好的训练数据应当干净、多样，而且来源清楚。",
        "注意力机制的计算量随序列长度平方增长，所以长文本很昂贵。",
    ),
    "food": (
        "{时间}，{人物}在厨房里做{菜}，满屋都是香味。",
        "做{菜}的关键是火候，火太大就会{失败}。",
        "我家乡的{菜}要配{配料}一起吃，味道才地道。",
        "{人物}说，{季节}吃{菜}最合适，因为{理由}。",
        "这道{菜}的做法是外婆传下来的，已经有{n}多年了。",
        "切好的{配料}要先腌{n}分钟，再下锅翻炒。",
    ),
    "travel": (
        "{时间}，我们坐车去了{地名}，一路上{感受}。",
        "{地名}的{景物}非常有名，来这里的游客{季节}最多。",
        "我们在{地名}住了{n}天，每天早上都去看{景物}。",
        "当地的{人物}给我们讲了很多关于{景物}的故事。",
        "离开{地名}的时候，{感受}，心里有些舍不得。",
        "从{地名}到{地名2}要走{n}公里山路，{感受}。",
    ),
}
ZH_SLOTS = {
    "时间": ("清晨", "傍晚", "周末的下午", "下过雨的早上", "深夜", "春节前后", "立秋那天", "一个阴天的中午"),
    "街道": ("老街", "河边的小路", "长安路", "梧桐大道", "巷子深处", "新修的步行街"),
    "店铺": ("早点铺", "旧书店", "裁缝店", "茶馆", "花店", "修表铺", "面馆"),
    "人物": ("爷爷", "邻居王阿姨", "一位老师傅", "我的同学小林", "书店老板", "一位年轻的工程师", "外婆", "导游"),
    "季节": ("春天", "夏天", "秋天", "冬天"),
    "理由": ("天气不冷不热", "到处都是花", "街上人不多", "可以吃到新鲜的果子", "晚上很安静"),
    "地点": ("河边", "老城墙下", "公园的长椅上", "车站门口", "图书馆的窗边", "桥头"),
    "感受": ("让人觉得很安心", "大家都很兴奋", "心里十分平静", "风景越来越好", "时间仿佛慢了下来"),
    "语料": ("新闻语料", "古诗词语料", "对话数据", "百科文本", "小说片段"),
    "能力": ("长距离依赖", "数字推理", "古文断句", "押韵规律", "人名识别"),
    "菜": ("红烧肉", "糖醋鱼", "饺子", "清炒时蔬", "酸辣汤", "葱油饼", "豆腐汤"),
    "失败": ("糊锅", "发苦", "变硬", "失去香味"),
    "配料": ("香菜", "姜丝", "青蒜", "辣椒", "葱花", "米醋"),
    "地名": ("黄山", "西湖", "丽江", "敦煌", "桂林", "苏州", "凤凰古城", "青海湖"),
    "景物": ("云海", "古塔", "石桥", "老街", "湖水", "日出", "梯田", "寺庙"),
}
ZH_POST_TEMPLATES = (
    "请问{事物}怎么{动作}？我试了{n}次都不行，有没有人知道原因。",
    "分享一下：{事物}终于弄好了，关键是要先{办法}。",
    "今天花了{n}个小时研究{事物}，虽然{结果}，但是学到了很多。",
    "提醒大家，用{事物}之前最好先{办法}，能省不少时间。",
)
ZH_THINGS = ("新买的相机", "家里的路由器", "这个分词器", "阳台上的花", "老式收音机", "学校的选课系统", "自行车的刹车")
ZH_ACTIONS = ("设置", "修好", "安装", "保养", "调试")
ZH_WAYS = ("看说明书", "重启一下", "换个电池", "问问客服", "把缓存清掉")
ZH_RESULTS = ("还是没成功", "结果很一般", "中间出了不少问题", "比预想的慢")

# ------------------------------------------------------------------------------------------ planted lines

BOILERPLATE = {
    "en_prose": ("Copyright © 2024 Example Press | All rights reserved", "first"),
    "en_verse": ("Read more at https://example.com/poems", "last"),
    "zh_prose": ("【本文来自网络 | 转载请注明出处】", "first"),
    "zh_poem": ("更多精彩内容，请关注公众号「诗词日报」", "last"),
    "post": ("Sent from my phone. Please excuse typos.", "last"),
}
REFRAINS = {
    "en_verse": "And still the river runs to the sea.",
    "zh_poem": "明月清风不用钱，青山绿水自悠然。",
}
PLACEHOLDERS = ("\ufffd", "□")
SHORT_TEXTS = ("ok", "好", "+1", "顶", "lol", "Thanks!", "谢谢分享", "nice", "沙发", "bump", "收藏了", "same")
REPEAT_UNITS = ("哈哈", "buy now ", "click here! ", "顶顶顶", "ha ", "转发 ", "lorem ipsum ", "666 ")
MOJIBAKE_EN = (
    "The café on the corner served a naïve little crème brûlée — it’s still “the best” in town.",
    "Zoë’s résumé mentioned a year in Zürich — “an education”, she said.",
    "The façade was restored in 1998 — its rosé-coloured stone is “unmistakable”.",
)


@dataclass
class Doc:
    kind: str
    text: str
    title: str | None = None
    author: str | None = None
    rhythmic: bool = False
    extra: dict = field(default_factory=dict)
    id: str | None = None
    order: int = -1  # global position in source order, set when written


class _Gen:
    def __init__(self, rng: random.Random):
        self.r = rng

    def pick(self, seq):
        return seq[self.r.randrange(len(seq))]

    # english
    def en_fill(self, template: str) -> str:
        r, p = self.r, self.pick
        nouns = r.sample(EN_NOUNS, 3)
        adjs = r.sample(EN_ADJS, 2)
        towns = r.sample(EN_TOWNS, 2)
        foods = r.sample(EN_FOODS, 2)
        year = r.randrange(1620, 1960)
        vals = dict(
            noun=nouns[0],
            noun2=nouns[1],
            noun3=nouns[2],
            adj=adjs[0],
            adj2=adjs[1],
            verb=p(EN_VERBS),
            verb2=p(EN_VERBS),
            tverb=p(EN_TVERBS),
            prep=p(EN_PREPS),
            time=p(EN_TIMES),
            Time=p(EN_TIMES).capitalize(),
            town=towns[0],
            town2=towns[1],
            food=foods[0],
            food2=foods[1],
            liquid=p(EN_LIQUIDS),
            n=r.randrange(2, 60),
            n2=r.randrange(2, 30),
            k=r.randrange(2, 12),
            First=p(EN_FIRST),
            Last=p(EN_LAST),
            season=p(EN_SEASONS),
            trade=p(EN_TRADES),
            year=year,
            year2=year + r.randrange(3, 60),
            dataset=p(EN_DATASETS),
            hw=p(EN_HW),
            feature=p(EN_FEATURES),
            word=p(EN_WORDS),
            size=p(EN_SIZES),
            lr=f"{r.randrange(1, 10)}e-{r.randrange(3, 6)}",
            thing=p(EN_THINGS),
            exp=p(EN_EXPS),
            fix=p(EN_FIXES),
        )
        s = template.format(**vals)
        return s[0].upper() + s[1:]

    def en_prose(self) -> Doc:
        topic = self.pick(sorted(EN_PROSE))
        templates = EN_PROSE[topic]
        paras = []
        for _ in range(self.r.randrange(1, 4)):
            sents = [self.en_fill(self.pick(templates)) for _ in range(self.r.randrange(3, 7))]
            paras.append(" ".join(sents))
        return Doc("en_prose", "\n\n".join(paras), extra={"topic": topic})

    def en_verse_lines(self, n: int) -> list[str]:
        return [self.en_fill(self.pick(EN_VERSE_TEMPLATES)) + self.pick((",", ",", ".", ";", "")) for _ in range(n)]

    def en_title(self) -> str:
        return f"The {self.pick(EN_ADJS).capitalize()} {self.pick(EN_NOUNS).capitalize()}"

    def en_name(self) -> str:
        return f"{self.pick(EN_FIRST)} {self.pick(EN_LAST)}"

    def en_verse(self) -> Doc:
        lines = self.en_verse_lines(self.r.randrange(4, 9))
        lines[-1] = lines[-1].rstrip(",;") + ("." if not lines[-1].endswith(".") else "")
        return Doc("en_verse", "\n".join(lines), title=self.en_title(), author=self.en_name())

    def en_post(self) -> Doc:
        # a forum template plus one or two sentences of prose: short, but not a fill-in-the-number copy
        topic = EN_PROSE[self.pick(sorted(EN_PROSE))]
        parts = [self.en_fill(self.pick(EN_POST_TEMPLATES))] + [
            self.en_fill(t) for t in self.r.sample(topic, self.r.randrange(1, 3))
        ]
        if self.r.random() < 0.5:
            parts.reverse()
        return Doc("post", " ".join(parts), extra={"lang": "en"})

    # chinese
    def zh_line(self, n: int) -> str:
        w = self.r.sample(ZH_WORDS, 3)
        v = self.pick(ZH_VERBS)
        if n == 5:
            return w[0] + v + w[1] if self.r.random() < 0.5 else w[0] + w[1] + v
        return w[0] + w[1] + v + w[2]

    def zh_couplet(self, n: int) -> str:
        return f"{self.zh_line(n)}，{self.zh_line(n)}。"

    def zh_poem(self, couplets: int | None = None) -> Doc:
        n = self.pick((5, 7))
        couplets = couplets or self.pick((2, 2, 4))
        rhythmic = self.r.random() < 0.15
        title = self.pick(ZH_RHYTHMIC) if rhythmic else self.pick(ZH_WORDS) + self.pick(ZH_TITLE_SUFFIX)
        paras = [self.zh_couplet(n) for _ in range(couplets)]
        return Doc("zh_poem", "\n".join(paras), title=title, author=self.zh_name(), rhythmic=rhythmic)

    def zh_name(self) -> str:
        return self.pick(ZH_SURNAMES) + "".join(self.r.sample(ZH_GIVEN, self.r.randrange(1, 3)))

    def zh_fill(self, template: str) -> str:
        vals = {k: self.pick(v) for k, v in ZH_SLOTS.items()}
        others = {k + "2": self.pick(v) for k, v in ZH_SLOTS.items()}
        vals.update(
            others,
            n=self.r.randrange(2, 60),
            n2=self.r.randrange(2, 30),
            k=self.r.randrange(2, 9),
            事物=self.pick(ZH_THINGS),
            动作=self.pick(ZH_ACTIONS),
            办法=self.pick(ZH_WAYS),
            结果=self.pick(ZH_RESULTS),
        )
        return template.format(**vals)

    def zh_prose(self) -> Doc:
        topic = self.pick(sorted(ZH_PROSE))
        # each template at most once per document, so documents of one topic share little text
        sents = [self.zh_fill(t) for t in self.r.sample(ZH_PROSE[topic], self.r.randrange(4, len(ZH_PROSE[topic]) + 1))]
        cuts = sorted(self.r.sample(range(1, len(sents)), self.r.randrange(1, 3)))
        paras = ["".join(sents[a:b]) for a, b in zip([0] + cuts, cuts + [len(sents)])]
        title = self.pick(ZH_SLOTS["地名"] + ZH_SLOTS["地点"]) + self.pick(("随笔", "小记", "杂谈", "印象", "见闻"))
        return Doc("zh_prose", "\n".join(paras), title=title, author=self.zh_name(), extra={"topic": topic})

    def zh_post(self) -> Doc:
        topic = ZH_PROSE[self.pick(sorted(ZH_PROSE))]
        parts = [self.zh_fill(self.pick(ZH_POST_TEMPLATES))] + [
            self.zh_fill(t) for t in self.r.sample(topic, self.r.randrange(1, 3))
        ]
        if self.r.random() < 0.5:
            parts.reverse()
        return Doc("post", "".join(parts), extra={"lang": "zh"})


# ------------------------------------------------------------------------------------------ text edits

_EN_PUNCT = re.compile(r"[,.;:!?'\"-]")
_ZH_PUNCT = {"，": ",", "。": ".", "：": ":", "？": "?", "！": "!", "、": ","}


def variant(text: str, how: str, rng: random.Random) -> str:
    """An exact-duplicate variant: same words, different whitespace / punctuation / case."""
    if how == "identical":
        return text
    if how == "whitespace":  # doubled spaces and trailing spaces; never a blank line (txt blocks)
        lines = [ln.replace(" ", "  ") + " " * rng.randrange(1, 3) for ln in text.split("\n")]
        return "\n".join(ln if ln.strip() else ln.strip() for ln in lines)
    if how == "punctuation":
        if any(ch in text for ch in _ZH_PUNCT):
            return "".join(_ZH_PUNCT.get(ch, ch) for ch in text)
        return _EN_PUNCT.sub("", text)
    if how == "case":
        return text.upper() if rng.random() < 0.5 else text.lower()
    raise ValueError(how)


def substitute(text: str, edits: int, rng: random.Random) -> str:
    """Near duplicate: `edits` single-character substitutions at letters / CJK characters."""
    chars = list(text)
    spots = [i for i, ch in enumerate(chars) if ch.isalpha()]
    for i in rng.sample(spots, edits):
        ch = chars[i]
        if "\u4e00" <= ch <= "\u9fff":
            pool = [c for c in ZH_EDIT_CHARS if c != ch]
        else:
            pool = [c for c in "abcdefghijklmnopqrstuvwxyz" if c != ch.lower()]
        new = rng.choice(pool)
        chars[i] = new.upper() if ch.isupper() else new
    return "".join(chars)


def reorder(text: str, rng: random.Random) -> str:
    """Near duplicate: two adjacent lines swapped."""
    lines = text.split("\n")
    i = rng.randrange(len(lines) - 1)
    lines[i], lines[i + 1] = lines[i + 1], lines[i]
    return "\n".join(lines)


def mojibake(text: str) -> str:
    """UTF-8 bytes read as Windows-1252 (bytes cp1252 leaves undefined map to the same code point, as
    ftfy's sloppy-windows-1252 does), so ftfy.fix_encoding restores the text exactly."""
    out = []
    for b in text.encode("utf-8"):
        try:
            out.append(bytes([b]).decode("cp1252"))
        except UnicodeDecodeError:
            out.append(chr(b))
    return "".join(out)


def _csv_row(fields: list[str]) -> str:
    buf = io.StringIO()
    csv.writer(buf, lineterminator="\n").writerow(fields)
    return buf.getvalue()


def _norm(text: str) -> str:
    return re.sub(r"[\W_]+", "", text.lower())


class _NoveltyIndex:
    """Keeps base documents apart: refuses a text whose char-5-gram Jaccard with an earlier one is >= max_j.

    Template-built text can otherwise yield pairs differing in one number, which a near-duplicate stage
    rightly flags but the manifest would not list. MinHash (32 hashes, 16 bands of 2) finds candidates;
    the exact Jaccard decides. Pure numpy + zlib, so the corpus does not depend on datasketch.
    """

    P = (1 << 31) - 1

    def __init__(self, max_j: float = 0.4, seed: int = 7):
        rs = np.random.RandomState(seed)
        self.a = rs.randint(1, self.P, size=32).astype(np.uint64)
        self.b = rs.randint(0, self.P, size=32).astype(np.uint64)
        self.max_j = max_j
        self.sets: list[set] = []
        self.bands: dict = {}

    def add_if_novel(self, text: str) -> bool:
        t = _norm(text)
        sh = {t[i : i + 5] for i in range(max(1, len(t) - 4))}
        if not t:
            return True
        h = np.fromiter((zlib.crc32(x.encode("utf-8")) for x in sh), dtype=np.uint64, count=len(sh))
        sig = ((h[:, None] * self.a[None, :] + self.b[None, :]) % self.P).min(axis=0)
        keys = [(i, int(sig[2 * i]), int(sig[2 * i + 1])) for i in range(16)]
        cands = {j for k in keys for j in self.bands.get(k, ())}
        for j in cands:
            other = self.sets[j]
            if len(sh & other) >= self.max_j * len(sh | other):
                return False
        n = len(self.sets)
        self.sets.append(sh)
        for k in keys:
            self.bands.setdefault(k, []).append(n)
        return True


# ------------------------------------------------------------------------------------------ the web part

WEB_PAGES = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "web" / "pages"  # README.md: origin, licence
WEB_FILE = "web/pages.warc.gz"
WEB_DATE = "2024-05-01T12:00:00Z"


def _warc_record(kind: str, url: str, block: bytes, content_type: str, n: int) -> bytes:
    head = (
        f"WARC/1.0\r\nWARC-Type: {kind}\r\nWARC-Target-URI: {url}\r\nWARC-Date: {WEB_DATE}\r\n"
        f"WARC-Record-ID: <urn:uuid:00000000-0000-4000-8000-{n:012d}>\r\nContent-Type: {content_type}\r\n"
        f"Content-Length: {len(block)}\r\n\r\n"
    )
    return head.encode() + block + b"\r\n\r\n"


def write_web_part(path: Path) -> tuple[list[dict], int]:
    """The fixture pages as request, response and metadata records, one gzip member each (mtime 0); returns the
    documents (id, url) and the number of records raw_records skips."""
    members, pages = [], []
    for page in sorted(WEB_PAGES.glob("*.html.gz")):
        url = f"https://demo.tokenmill.invalid/{page.name.removesuffix('.html.gz')}"
        body = b"HTTP/1.1 200 OK\r\nContent-Type: text/html; charset=utf-8\r\n\r\n" + gzip.decompress(page.read_bytes())
        pages.append({"id": record_id(WEB_FILE, index=len(members) + 1), "url": url})
        for kind, block, ctype in (
            ("request", b"GET / HTTP/1.1\r\n\r\n", "application/http; msgtype=request"),
            ("response", body, "application/http; msgtype=response"),
            ("metadata", b"fetchTimeMs: 120\r\n", "application/warc-fields"),
        ):
            members.append(_warc_record(kind, url, block, ctype, len(members)))
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for member in members:
            f.write(gzip.compress(member, compresslevel=9, mtime=0))
    return pages, len(members) - len(pages)


# ------------------------------------------------------------------------------------------ the corpus

FILES = {  # relpath -> format; the order here is not the source order (raw_records sorts paths)
    "en/articles.jsonl": "jsonl",
    "en/verse.txt": "txt",
    "zh/poetry.json": "json",
    "zh/essays.csv": "csv",
    "mixed/forum.jsonl.gz": "jsonl.gz",
}
HOME = {
    "en_prose": "en/articles.jsonl",
    "en_verse": "en/verse.txt",
    "zh_poem": "zh/poetry.json",
    "zh_prose": "zh/essays.csv",
    "post": "mixed/forum.jsonl.gz",
}
COUNTS = {"en_prose": 620, "en_verse": 360, "zh_poem": 820, "zh_prose": 380, "post": 520}


def generate_demo_corpus(out_dir, seed: int = DEFAULT_SEED) -> dict:
    """Writes out_dir/source/ and out_dir/manifest.json; returns the manifest. Same seed, same bytes."""
    out_dir = Path(out_dir)
    src = out_dir / "source"
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    rng = random.Random(seed)
    g = _Gen(rng)

    # 1. base documents, far from each other (no accidental exact or near duplicates)
    novel = _NoveltyIndex()
    base: dict[str, list[Doc]] = {}
    makers = {"en_prose": g.en_prose, "en_verse": g.en_verse, "zh_poem": g.zh_poem, "zh_prose": g.zh_prose}
    for kind in ("en_prose", "en_verse", "zh_poem", "zh_prose", "post"):
        docs = []
        while len(docs) < COUNTS[kind]:
            if kind == "post":
                d = g.en_post() if rng.random() < 0.5 else g.zh_post()
            elif kind == "zh_poem" and len(docs) < 120:  # long poems for near duplicates and refrains
                d = g.zh_poem(couplets=4)
            else:
                d = makers[kind]()
            if novel.add_if_novel(d.text):
                docs.append(d)
        base[kind] = docs

    # 2. disjoint pools per kind for each planting
    pools = {k: rng.sample(v, len(v)) for k, v in base.items()}

    def take(kind, n):
        out, pools[kind] = pools[kind][:n], pools[kind][n:]
        return out

    long_poems = [d for d in pools["zh_poem"] if d.text.count("\n") >= 3]
    pools["zh_poem"] = [d for d in pools["zh_poem"] if d.text.count("\n") < 3] + long_poems  # long ones last

    extra: dict[str, list[Doc]] = {k: [] for k in FILES}
    exact, near, boiler, refrain_docs, moji, garbled, header = [], [], [], [], [], [], []

    # genuine frequent lines: a refrain at a random position (edges included) in many documents
    for kind, line in REFRAINS.items():
        cand = [d for d in pools[kind] if d.text.count("\n") >= 3][-45:] if kind == "zh_poem" else take(kind, 45)
        if kind == "zh_poem":
            pools[kind] = [d for d in pools[kind] if all(d is not c for c in cand)]
        for d in cand:
            lines = d.text.split("\n")
            lines.insert(rng.randrange(len(lines) + 1), line)
            d.text = "\n".join(lines)
            refrain_docs.append((d, line))

    # exact duplicates: 4 variants
    for kind, hows in (
        ("en_prose", ("identical", "whitespace", "punctuation", "case") * 4),
        ("en_verse", ("identical", "whitespace", "case", "punctuation") * 3),
        ("zh_poem", ("identical", "whitespace", "punctuation") * 5),
        ("zh_prose", ("identical", "punctuation", "whitespace") * 3),
        ("post", ("identical", "case", "punctuation")),
    ):
        for d, how in zip(take(kind, len(hows)), hows):
            copy = Doc(
                kind,
                variant(d.text, how, rng),
                title=d.title,
                author=d.author,
                rhythmic=d.rhythmic,
                extra=dict(d.extra),
            )
            dest = HOME[kind] if rng.random() < 0.7 or kind in ("en_verse",) else "mixed/forum.jsonl.gz"
            extra[dest].append(copy)
            exact.append((d, copy, how))

    # near duplicates: substitutions (1-3 characters by length) and swapped lines (texts of >= 4 lines and
    # >= 50 letters, so a swap leaves most shingles intact)
    for kind, n_sub, n_reorder in (("en_prose", 10, 0), ("en_verse", 6, 6), ("zh_poem", 10, 6), ("zh_prose", 8, 4)):
        pool = pools[kind]
        if kind == "zh_poem":  # 4-couplet poems only
            pool = [d for d in pool if d.text.count("\n") >= 3][::-1]
        subs = pool[:n_sub]
        swaps = [d for d in pool[n_sub:] if d.text.count("\n") >= 3 and len(_norm(d.text)) >= 50][:n_reorder]
        used = {id(d) for d in subs + swaps}
        pools[kind] = [d for d in pools[kind] if id(d) not in used]
        for d in subs + swaps:
            if any(d is x for x in subs):
                edits = 1 if len(d.text) < 100 else 2 if len(d.text) < 300 else 3
                text, how = substitute(d.text, edits, rng), "substitution"
            else:
                edits, text, how = 1, reorder(d.text, rng), "reorder"
            copy = Doc(
                kind,
                text,
                title=d.title,
                author=g.zh_name() if kind == "zh_poem" else d.author,
                rhythmic=d.rhythmic,
                extra=dict(d.extra),
            )
            extra[HOME[kind]].append(copy)
            near.append((d, copy, how, edits))

    # boilerplate header / footer lines
    for kind, (line, where) in BOILERPLATE.items():
        for d in take(kind, 40 if kind != "post" else 30):
            d.text = f"{line}\n{d.text}" if where == "first" else f"{d.text}\n{line}"
            boiler.append((d, line))

    # header metadata inside the text
    for d in take("en_verse", 15):
        header.append((d, d.title, d.author))
        d.text = f"Title: {d.title}\nAuthor: {d.author}\n{d.text}"
        d.extra["header"] = True
    for d in take("zh_prose", 10):
        header.append((d, d.title, d.author))
        d.text = f"标题：{d.title}\n作者：{d.author}\n{d.text}"
        d.extra["header"] = True

    # mojibake: English prose with accents and curly quotes, Chinese prose
    for d in take("en_prose", 12):
        d.text = d.text + " " + g.pick(MOJIBAKE_EN)
        moji.append((d, d.text))
        d.text = mojibake(d.text)
    for d in take("zh_prose", 8):
        moji.append((d, d.text))
        d.text = mojibake(d.text)

    # garbled records: placeholder glyphs, too short, empty, repetitive
    def garble(dest: str, text: str, reason: str, kind="garbled", **kw):
        d = Doc(kind, text, **kw)
        extra[dest].append(d)
        garbled.append((d, reason))

    for i in range(16):
        src_text = (g.zh_prose() if i % 2 else g.en_prose()).text
        glyph = PLACEHOLDERS[i % 2]
        chars = [glyph if (not c.isspace() and rng.random() < 0.6) else c for c in src_text]
        garble("mixed/forum.jsonl.gz" if i < 10 else "en/articles.jsonl", "".join(chars), "placeholder_glyphs")
    for i, t in enumerate(SHORT_TEXTS):
        garble("mixed/forum.jsonl.gz" if i < 8 else "zh/essays.csv", t, "too_short")
    for i, t in enumerate(("", "   ", "\n\n", "", " \t ", "")):
        garble(("mixed/forum.jsonl.gz", "en/articles.jsonl", "zh/essays.csv")[i % 3], t, "empty")
    garble("zh/poetry.json", "", "empty", kind="zh_poem", title="无题", author=g.zh_name())
    garble("zh/poetry.json", "", "empty", kind="zh_poem", title="残篇", author=g.zh_name())
    for i in range(14):
        if i % 3 == 0:
            line = g.en_post().text if i % 2 else g.zh_post().text
            text = "\n".join([line] * rng.randrange(12, 30))
        else:
            text = REPEAT_UNITS[i % len(REPEAT_UNITS)] * rng.randrange(40, 120)
        garble("mixed/forum.jsonl.gz" if i < 9 else "en/articles.jsonl", text.strip(), "repetition")

    # 3. file contents: base docs of each file in their (shuffled) order, planted copies spread among them
    layout: dict[str, list] = {}
    for rel in FILES:
        kind = next(k for k, v in HOME.items() if v == rel)
        entries = list(base[kind])
        for d in extra[rel]:
            entries.insert(rng.randrange(len(entries) + 1), d)
        layout[rel] = entries

    # bad lines, with where they go (inserted by index into the entry list)
    bad_lines = {
        "en/articles.jsonl": [
            ('{"id": "ex-broken-1", "text": "The unfinished record stops here', "malformed_json"),
            ('{"id": "ex-broken-2", "text": "A trailing comma is not JSON",}', "malformed_json"),
            ("{'id': 'ex-broken-3', 'text': 'single quotes are not JSON'}", "malformed_json"),
            ('{"id": "ex-broken-4", "text": "missing the closing brace"', "malformed_json"),
            ("this line is not JSON at all", "malformed_json"),
            (
                '{"id": "ex-notext-1", "body": "the text is under the wrong key", "metadata": {"lang": "en"}}',
                "no_text_field",
            ),
            ('{"id": "ex-notext-2", "text": null, "metadata": {"lang": "en"}}', "no_text_field"),
            ('["a", "list", "is", "not", "an", "object"]', "not_an_object"),
        ],
        "mixed/forum.jsonl.gz": [
            ('{"user": "river_fan", "text": "cut off mid-', "malformed_json"),
            ('{"user": "夜读", "text": "缺少右引号}', "malformed_json"),
            ("42", "not_an_object"),
            (b'{"user": "latin1", "text": "caf\xe9 au lait, \xa3 3.50"}', "undecodable_bytes"),
        ],
        "zh/essays.csv": [
            ("多余的列,作者,正文,2024-01-01,这一列多出来了", "malformed_csv_row"),
        ],
    }
    for rel, bads in bad_lines.items():
        for raw, reason in bads:
            layout[rel].insert(rng.randrange(1, len(layout[rel])), ("bad", raw, reason))

    files_info, rejected_raw = {}, []
    for rel in sorted(FILES):
        fmt = FILES[rel]
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        n_ok = n_bad = 0
        entries = layout[rel]
        if fmt in ("jsonl", "jsonl.gz"):
            buf = io.BytesIO()
            for lineno, e in enumerate(entries, 1):
                if isinstance(e, tuple):
                    raw = e[1] if isinstance(e[1], bytes) else e[1].encode("utf-8")
                    buf.write(raw + b"\n")
                    rejected_raw.append({"path": rel, "line": lineno, "reason": e[2]})
                    n_bad += 1
                    continue
                if rel.startswith("en/"):
                    obj = {
                        "id": f"ex-{lineno:05d}",
                        "text": e.text,
                        "metadata": {
                            "url": f"https://example.org/{e.extra.get('topic', 'misc')}/{lineno}",
                            "lang": "en",
                            **({"topic": e.extra["topic"]} if "topic" in e.extra else {}),
                        },
                    }
                else:
                    obj = {"user": f"user{rng.randrange(1, 400)}", "lang": e.extra.get("lang", "mixed"), "text": e.text}
                buf.write(json.dumps(obj, ensure_ascii=False).encode("utf-8") + b"\n")
                e.id = record_id(rel, line=lineno)
                n_ok += 1
            data = buf.getvalue()
            if fmt == "jsonl.gz":
                gz = io.BytesIO()
                with gzip.GzipFile(filename="", mode="wb", fileobj=gz, mtime=0, compresslevel=9) as f:
                    f.write(data)
                data = gz.getvalue()
            path.write_bytes(data)
        elif fmt == "json":
            items = []
            for i, e in enumerate(entries):
                obj = {"author": e.author, "paragraphs": e.text.split("\n") if e.text else []}
                obj["rhythmic" if e.rhythmic else "title"] = e.title
                obj["id"] = "-".join(f"{rng.getrandbits(bits):0{bits // 4}x}" for bits in (32, 16, 16, 16, 48))
                items.append(obj)
                e.id = record_id(rel, index=i)
                n_ok += 1
            path.write_text(json.dumps(items, ensure_ascii=False, indent=4) + "\n", encoding="utf-8")
        elif fmt == "txt":
            out, lineno = [], 1
            for e in entries:
                lines = e.text.split("\n")
                out.append(e.text)
                e.id = record_id(rel, line=lineno)
                lineno += len(lines) + 1
                n_ok += 1
            path.write_text("\n\n".join(out) + "\n", encoding="utf-8")
        elif fmt == "csv":
            rows = [_csv_row(["title", "author", "text", "date"])]
            lineno = 2
            for e in entries:
                if isinstance(e, tuple):
                    row = e[1] + "\n"
                    rejected_raw.append({"path": rel, "line": lineno, "reason": e[2]})
                    n_bad += 1
                else:
                    in_text = e.extra.get("header")  # title/author only in the text's header lines
                    date = f"20{rng.randrange(10, 25)}-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
                    row = _csv_row(
                        ["" if in_text else (e.title or ""), "" if in_text else (e.author or ""), e.text, date]
                    )
                    e.id = record_id(rel, line=lineno)
                    n_ok += 1
                rows.append(row)
                lineno += row.count("\n")  # quoted fields may span lines; ids use the row's first line
            path.write_text("".join(rows), encoding="utf-8")
        files_info[rel] = {"format": fmt, "records": n_ok, "rejected": n_bad}

    skipped = "notes/README.md"
    (src / skipped).parent.mkdir(parents=True, exist_ok=True)
    (src / skipped).write_text(
        "# Demo corpus\n\nGenerated by `python -m devtools.demo`; raw_records skips this file (unknown extension).\n",
        encoding="utf-8",
    )

    web_pages, web_skipped = write_web_part(src / WEB_FILE)
    files_info[WEB_FILE] = {"format": "warc.gz", "records": len(web_pages), "rejected": 0}

    # 4. source order (sorted paths, then position) for pairs: a is the copy seen first
    order = {}
    for rel in sorted(FILES):
        for e in layout[rel]:
            if isinstance(e, Doc):
                order[id(e)] = len(order)

    def pair(a, b):
        return (a, b) if order[id(a)] < order[id(b)] else (b, a)

    kinds: dict[str, int] = {}
    for rel in FILES:
        for e in layout[rel]:
            if isinstance(e, Doc):
                kinds[e.kind] = kinds.get(e.kind, 0) + 1

    exact_pairs = [pair(a, b) + (how,) for a, b, how in exact]
    near_pairs = [pair(a, b) + (how, edits) for a, b, how, edits in near]
    manifest = {
        "generator": GENERATOR,
        "seed": seed,
        "records": sum(f["records"] for f in files_info.values()),
        "record_kinds": dict(sorted(kinds.items())),
        "files": files_info,
        "skipped_files": [skipped],
        "web_pages": web_pages,
        "web_skipped_records": web_skipped,
        "rejected_raw": sorted(rejected_raw, key=lambda r: (r["path"], r["line"])),
        "exact_duplicates": [[a.id, b.id] for a, b, _ in exact_pairs],
        "exact_duplicate_variants": [{"a": a.id, "b": b.id, "variant": how} for a, b, how in exact_pairs],
        "near_duplicates": [{"a": a.id, "b": b.id, "edit": how, "edits": n} for a, b, how, n in near_pairs],
        "boilerplate_lines": [line for line, _ in BOILERPLATE.values()],
        "boilerplate_docs": [{"id": d.id, "lines": [line]} for d, line in boiler],
        "genuine_frequent_lines": list(REFRAINS.values()),
        "genuine_frequent_docs": [{"id": d.id, "line": line} for d, line in refrain_docs],
        "genuine_frequent_words": ["春", "月", "Transformer"],
        "mojibake": [{"id": d.id, "original": orig} for d, orig in moji],
        "garbled": [{"id": d.id, "reason": reason} for d, reason in garbled],
        "header_metadata": [{"id": d.id, "title": t, "author": a} for d, t, a in header],
    }
    atomic_write_json(out_dir / "manifest.json", manifest)
    return manifest


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description="Write the seeded demo corpus (source/ + manifest.json).")
    ap.add_argument("out_dir", help="folder to write (its source/ subfolder is replaced)")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    args = ap.parse_args(argv)
    m = generate_demo_corpus(args.out_dir, seed=args.seed)
    size = sum(p.stat().st_size for p in (Path(args.out_dir) / "source").rglob("*") if p.is_file())
    print(
        f"demo corpus: {m['records']} records, {len(m['rejected_raw'])} bad lines, {size / 1e6:.2f} MB "
        f"in {Path(args.out_dir) / 'source'}"
    )


if __name__ == "__main__":
    main()

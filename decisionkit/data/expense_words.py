"""The words of the expense claims (``expense_claims`` writes them): employee levels and limits, categories,
merchants, items, places and people, and the notes' templates by signal (personal, duplicate, an approved
exception, a harmless explanation, routine), with the pasted e-mail threads' filler. Data only; seeded draws from
these lists are the generator's."""

from __future__ import annotations

LEVELS = ["junior", "staff", "senior", "manager", "director"]
LEVEL_WEIGHTS = [18, 34, 24, 16, 8]
APPROVAL_LIMIT = {"junior": 500, "staff": 1000, "senior": 2500, "manager": 5000, "director": 10000}
DEPARTMENTS = ["sales", "engineering", "marketing", "operations", "finance", "hr", "support", "legal"]
CATEGORIES = ["meals", "travel", "lodging", "software", "equipment", "training", "client_gift", "mileage", "other"]
CATEGORY_WEIGHTS = [20, 16, 13, 9, 10, 8, 7, 8, 9]
CURRENCIES = ["USD", "EUR", "GBP", "CAD", "JPY", "CHF"]
PAYMENT = ["personal_card", "personal_card", "personal_card", "cash", "bank_transfer"]
MILEAGE_RATE = 0.42  # USD per km

# Policy limits: (limit, basis). "person" multiplies by attendees, "night" by nights; the state carries the total.
LIMITS = {"meals": (75, "per person"), "travel": (900, "per trip"), "lodging": (240, "per night"),
          "software": (300, "per claim"), "equipment": (1500, "per claim"), "training": (2000, "per claim"),
          "client_gift": (100, "per recipient"), "mileage": (400, "per claim"), "other": (250, "per claim")}

MERCHANTS = {
    "meals": ["Osteria Lupa", "The Harbor Grill", "Blue Fern Cafe", "Sakura Garden", "Cafe Mirabel", "Smokehouse 22",
              "Le Petit Zinc", "Green Bowl"],
    "travel": ["Skyline Airways", "Northstar Air", "Metro Rail", "CityCab", "RideNow", "Coastline Rail",
               "Avion Express", "QuickCar Rentals"],
    "lodging": ["Harborview Hotel", "Grand Meridian", "Parkside Inn", "Stayright Suites", "Hotel Aurora",
                "Lakeshore Lodge"],
    "software": ["Figmate", "SurveyLoop", "CodeCanvas", "Notewise", "DataPilot", "CloudDraw"],
    "equipment": ["TechDepot", "OfficeHub", "PixelStore", "ByteMart", "DeskWorks"],
    "training": ["LearnPoint", "Skillforge Academy", "DataCamp Pro", "PMI Chapter", "Codecraft Institute"],
    "client_gift": ["Hamper & Co", "Vino Select", "Chocolatier Roux", "GiftBox Studio"],
    "mileage": ["own car"],
    "other": ["PrintRight", "FastCourier", "Visa Office", "Booth Supplies Inc", "Parcel Post"],
}
ITEMS = {
    "meals": ["dinner", "lunch", "breakfast", "drinks", "dessert", "coffee", "service charge", "tip", "wine",
              "appetisers"],
    "travel": ["flight", "return flight", "train ticket", "taxi", "airport transfer", "baggage fee", "seat upgrade",
               "rental car", "fuel", "parking", "ride share"],
    "lodging": ["room", "city tax", "breakfast", "parking", "late checkout", "wifi", "laundry", "minibar"],
    "software": ["annual licence", "monthly subscription", "extra seat", "plugin", "support plan", "storage add-on"],
    "equipment": ["monitor", "laptop", "keyboard", "mouse", "headset", "docking station", "webcam", "cables",
                  "chair", "tablet"],
    "training": ["course fee", "exam fee", "workshop ticket", "study guide", "conference pass", "materials"],
    "client_gift": ["gift basket", "wine", "chocolates", "engraving", "delivery", "flowers"],
    "mileage": ["mileage", "tolls", "parking"],
    "other": ["printing", "courier", "visa fee", "booth materials", "postage", "shipping"],
}
THINGS = {"meals": "dinner", "travel": "flight", "lodging": "hotel stay", "software": "licence",
          "equipment": "purchase", "training": "course", "client_gift": "gift order", "mileage": "mileage",
          "other": "expense"}

CITIES = ["Denver", "Lisbon", "Austin", "Toronto", "Berlin", "Chicago", "Zurich", "Seattle", "Madrid", "Boston",
          "Dublin", "Osaka", "Atlanta", "Vienna", "Phoenix", "Montreal"]
CLIENTS = ["Acme Freight", "Bluewater Health", "Kestrel Foods", "Orion Retail", "Pinecrest Bank", "Vantage Labs",
           "Solace Energy", "Halcyon Media", "Ironbridge Logistics", "Meadowlark Insurance"]
PEOPLE = ["Dana Whitfield", "Marco Ruiz", "Priya Nair", "Tom Okafor", "Helen Brandt", "Sven Lund", "Aiko Mori",
          "Grace Kim", "Luis Moreno", "Rachel Stein", "Omar Haddad", "Julia Novak"]
CONFERENCES = ["DataSummit", "CloudCon", "SalesForward", "DevOps Days", "UX Week", "FinOps Forum"]

# --- notes ---------------------------------------------------------------------------------------------------------
# Each template: (categories it fits, or None for any; text with {city} {client} {person} {n} {thing} {cur} {conf}).

PERSONAL = [
    (None, "honestly this one was for a family weekend away, but it went on the card I use for work"),
    (None, "Bought this for my son's birthday, figured I'd put it through since I was on a work trip anyway."),
    (["meals"], "Took my wife out for our anniversary while I was in {city} for the offsite."),
    (None, "This was a personal purchase, paid with the wrong card, sorry. Would be great to get it back anyway."),
    (["equipment"], "Gaming laptop for home, I play on it most evenings but I do check email on it too."),
    (["lodging", "travel"], "Stayed on two extra days for a beach holiday with my partner, those nights are in here."),
    (["travel", "lodging"], "My sister's wedding was that same weekend, so this covers getting there and back."),
    (["meals"], "Dinner with old college friends, none of them are clients, though we did talk shop a bit."),
    (["other", "client_gift"], "Christmas presents for my kids, picked up at the airport on the way home."),
    (["meals", "other"], "Groceries for the week from the hotel shop, the fridge at home was empty when I got back."),
    (["equipment", "other"], "New bike for my weekend rides, it's kind of a wellness thing so I thought it counts."),
    (["meals"], "Date night with my girlfriend in {city}, we both happened to be there for the conference."),
    (["travel", "lodging"], "Was really a personal trip, I only had one short call with {client} during the week."),
    (["other"], "Dog boarding while I was away for work, the kennel bill basically."),
    (["lodging", "other"], "Spa day and massage at the resort to recover, it was a rough quarter lol"),
    (["other", "client_gift"], "Concert tickets for me and my husband, the venue was right by the client office."),
    (["equipment"], "new TV for the living room, I sometimes watch the training webinars on it"),
    (["meals"], "Family dinner while my parents were visiting, we ate near the office so I filed it as a team meal."),
    (["software"], "Streaming subscription for the household, I watch the odd industry documentary on it."),
    (["travel"], "Flights for my kids to visit their grandparents, booked on the company portal by mistake."),
    (["other", "travel"], "weekend golf trip with my brother in law, no clients there this time"),
    (["lodging"], "Holiday rental for our family vacation, I did take a couple of calls from the balcony."),
    (["software"], "Bought the premium photo editing app for my wedding pictures, not really work related."),
    (["training"], "Cooking class I signed up for as a hobby, good for team building skills I suppose."),
    (["mileage"], "These are the drives to my kid's soccer tournament, I used my own car anyway."),
    (["mileage"], "Drove up to see my mum for the weekend, stopped by the branch for ten minutes on the way."),
    (["client_gift"], "Flowers for my wife's birthday, ordered through the usual gift supplier."),
    (["training"], "Yoga retreat for myself, mindfulness helps me at work so I hope this is okay."),
    (["equipment"], "Espresso machine for my kitchen, I make coffee before my morning standups."),
    (None, "Not strictly business, to be fair: it was for my own use at home, but I'd appreciate the help."),
]

DUPLICATE = [
    (None, "Re-submitting this, the first one seems to have got lost somewhere in the system."),
    (None, "Already claimed this on the corporate card statement last month, adding it here too for completeness."),
    (None, "Same {thing} as my claim from last week, the portal timed out so not sure it went through."),
    (None, "Second copy: I also filed this on paper with {person} before the system switch."),
    (None, "This duplicates EXP-1{n}, which I sent from my phone; submitting again from the laptop just in case."),
    (None, "I think I filed this one twice by mistake? The earlier version is still pending."),
    (["travel", "lodging"], "The travel agency already billed this straight to the company, but I'm claiming it too."),
    (None, "Sending again since I never heard back about the original claim for this."),
    (["meals"], "A colleague already expensed the whole bill for this dinner, but I'm putting in the same receipt."),
    (None, "resubmitted - the original claim for this was approved but I don't think the money arrived"),
    (None, "Copy of the claim I made in October, the payment may have been lost in the payroll change."),
    (["meals", "travel"], "This is covered by my per diem already, but the receipt was separate so claiming it here."),
    (["training"], "Also claimed through the conference organiser's refund, sending in case that falls through."),
    (None, "Duplicate of yesterday's entry, only this time with the right cost centre on it."),
    (["lodging"], "Hotel charged both my card and the company account for the stay; claiming my card charge."),
    (None, "Putting this in again, I think it was reimbursed in the last run but I can't see it on my payslip."),
    (["travel", "lodging"], "Same trip as the claim {person} filed for both of us; this is my share of what she got."),
    (None, "Forgot I'd submitted this before the holidays, so entering it once more to be safe."),
    (None, "already went through on the p-card i believe, but finance wanted personal claims so here it is"),
    (None, "Re-entering the {thing} from my earlier report because that report is stuck in draft, or submitted?"),
    (None, "Filing again: the first claim for this {thing} was under my old employee number."),
    (None, "Paid by the company credit card already; I'm claiming it as well in case the card payment bounces."),
    (None, "Third time lucky? Submitted this twice before and both show as received."),
    (["software"], "IT bought this licence centrally too, but I'd already paid, so claiming my copy of the invoice."),
    (None, "Same receipt as my claim two weeks ago, the amount was just split differently across the lines."),
]

EXCEPTION = [
    (None, "VP approved the overage in advance, see the email thread from {person}."),
    (["meals"], "Client meeting ran late; the higher spend was pre-approved by finance (ticket FIN-{n})."),
    (None, "{person} signed off on the higher rate before the trip, approval attached."),
    (["lodging"], "Conference hotel block is above the cap; the travel desk approved an exception before booking."),
    (None, "Exception granted in advance by the CFO's office for this vendor, reference PA-{n}."),
    (["travel"], "Pre-approved upgrade to business class for the long-haul leg, per the accommodation on file."),
    (["meals", "client_gift"], "My director okayed going over the limit for this client beforehand, in writing."),
    (None, "Budget owner {person} approved the extra attendees and the spend ahead of time."),
    (None, "Overage cleared with finance before the purchase; they said to quote approval {n}."),
    (["software"], "Signed exception form for the premium licence tier is on file with procurement."),
    (["travel"], "The only flight that made the meeting was pricier, and {person} okayed it in writing before I booked."),
    (None, "Approved in advance by the regional head as part of the {client} deal budget."),
    (["meals"], "Over the per-person cap, but cleared with my manager and finance in the planning doc beforehand."),
    (None, "Policy exception PE-{n} covers this, approved by {person} last month."),
    (["meals", "other", "client_gift"], "Finance pre-authorised up to double the usual limit for the launch event."),
    (["equipment"], "Had prior approval from {person} to exceed the equipment cap, the standard model can't run CAD."),
    (None, "this was greenlit by the VP ahead of time, she cc'd finance on the approval"),
    (["training"], "Pre-approval {n} from HR covers the certification course above the training budget."),
    (["meals"], "Our SVP asked me to host and approved the higher budget before the dinner."),
    (["lodging"], "Extra night approved in advance by {person} because the workshop moved by a day."),
    (None, "Went over the limit with written sign-off from {person} obtained the week before."),
    (None, "Finance confirmed beforehand that this one may exceed the cap, approval id {n}."),
    (["mileage"], "Long drive was agreed with {person} in advance instead of flying, approval in the travel request."),
    (None, "Above policy, yes, but the exception was approved before I spent anything (request {n})."),
]

BENIGN = [
    (["meals"], "The restaurant was the client's choice, it was a bit pricier than our usual places."),
    (None, "Prices in {city} are just higher than at home, nothing I could do about that."),
    (["meals"], "Tip and service charge are included in the total."),
    (["travel"], "Took a taxi since the train was cancelled because of the strike."),
    (["lodging"], "Only hotel with rooms left near the venue that week, everything else was full."),
    (None, "Receipt is a bit faded, the amount should still be readable on the scan."),
    (["travel"], "Booked late so the fare was higher than I'd hoped, the meeting was confirmed last minute."),
    (None, "Paid in {cur}, converted at the card's exchange rate on the day."),
    (None, "Split across two receipts because the card terminal failed on the first try."),
    (["meals"], "We ran over time and had to order dinner in for the whole team."),
    (["software"], "Vendor raised their prices this year, it is the same licence as before."),
    (["travel"], "Airport parking since the early flight left before public transport starts."),
    (["equipment"], "Bought the higher-spec model because the standard one was out of stock everywhere."),
    (["meals"], "Dinner ran long with the {client} folks, and they ordered the wine."),
    (["lodging"], "Includes the city tax the hotel added at checkout."),
    (["travel"], "Had to rebook after the airline cancelled my connection in {city}."),
    (["training"], "Course fee went up since last year's session, same provider."),
    (["meals", "client_gift"], "Extra people joined last minute, the client asked for their engineers to come along."),
    (["mileage"], "Mileage is from the office to the site and back, two visits that week."),
    (None, "The card was charged in two parts, both parts are listed in the items."),
    (None, "Sorry, I know this is on the high side, it was the best option available at short notice."),
    (["equipment", "software"], "Needed it urgently for the {client} demo, so I couldn't wait for IT to order it."),
    (["other"], "Express shipping because the contracts had to reach {client} by Friday."),
    (["lodging"], "Hotel was more than planned as the conference rate had sold out."),
]

NEUTRAL = [
    (["meals"], "Team lunch after the quarterly planning session."),
    (["meals"], "Dinner with {client} to go over the renewal and next year's roadmap."),
    (["meals"], "Breakfast meeting with the new hire cohort in {city}."),
    (["meals"], "Working lunch during the {client} onboarding workshop."),
    (["meals"], "Dinner with {client}'s CEO and her husband, mostly about the expansion."),
    (["travel"], "Flight to {city} for the {client} kickoff."),
    (["travel"], "Train to {city} and back for the site visit."),
    (["travel"], "Taxis between the airport and the client office."),
    (["travel"], "Rental car for the regional sales tour, returned full."),
    (["lodging"], "Two nights in {city} for the partner summit."),
    (["lodging"], "Hotel during the {client} implementation week."),
    (["lodging"], "Stayed near the data centre for the weekend migration."),
    (["software"], "Annual licence renewal for the design tool the team uses."),
    (["software"], "Monthly subscription for the survey platform, team plan."),
    (["software"], "Plugin for the analytics stack, needed for the Q4 report."),
    (["equipment"], "Replacement monitor, the old one died on Monday."),
    (["equipment"], "Keyboard and mouse for the new desk in the {city} office."),
    (["equipment"], "Docking station and cables for the hot desks."),
    (["equipment"], "Headset for customer calls, bought from the approved vendor list."),
    (["training"], "Registration for the {conf} workshop."),
    (["training"], "Online course on negotiation, agreed in my annual review."),
    (["training"], "Certification exam fee, first attempt."),
    (["client_gift"], "Holiday gift baskets for the {client} team."),
    (["client_gift"], "Thank-you gift after the {client} contract signing."),
    (["mileage"], "Drove to the {city} warehouse for the inventory count."),
    (["mileage"], "Round trip to the client site in my own car."),
    (["other"], "Printing for the trade show booth."),
    (["other"], "Courier for the signed contracts to {client}."),
    (["other"], "Visa fee for the {city} trip next month."),
    (None, "For the {client} account, see the itemised receipt."),
    (None, "Business expense as discussed in the team meeting."),
    (None, "Standard claim for last week's work in {city}."),
    (None, "Corrected the cost centre, the first draft was withdrawn before anyone reviewed it."),
    (None, "Family-owned supplier we have used for years, invoice attached."),
]
SIGNALS = {"personal": PERSONAL, "duplicate": DUPLICATE, "exception": EXCEPTION, "benign": BENIGN,
           "neutral": NEUTRAL}

OPENERS = ["Hi, ", "Hi team - ", "FYI: ", "Note: ", "For the approver: ", "Quick note - ", "Hello, ", "Context: "]
TAILS = ["Thanks!", "Thanks.", "Let me know if you need anything else.", "Cheers", "Thx", "Happy to explain.",
         "Any questions, ping me.", "Best, {first}"]
CONTEXT = [
    "This was during the {client} project.", "Cost centre is CC-{n}.", "Please charge it to the {dept} budget.",
    "The items are listed below.", "Submitted from my phone, sorry for the formatting.",
    "Project code is in the field above.", "My manager is {person} if you need to check anything.",
    "It's the last claim for this quarter.", "Everything is itemised as usual.", "Receipt scanned with the app.",
    "It was a busy week with {client}.", "Sorry it is a bit late in the month.", "First time using the new portal.",
]
TRIP_CONTEXT = [  # only for claims that come from a trip or an outing
    "It was for the {city} trip.", "I was there from Monday to Thursday.", "This closes out the {city} week.",
    "The {conf} event was the main reason for the trip.",
]
TRIP_CATEGORIES = ("meals", "travel", "lodging", "mileage", "training")

# --- pasted e-mail threads ---------------------------------------------------------------------------------------
FILLER = [
    "Thanks for pulling this together so quickly.", "I've attached the agenda for the two days.",
    "Can we move the Tuesday session to the afternoon so the {client} people can join?",
    "The venue confirmed the room for twelve, with a projector and whiteboards.",
    "I'll send the updated slides tonight once legal has reviewed the pricing page.",
    "Catering wants final numbers by Thursday, so please confirm who is coming.",
    "Just a reminder that the badge office closes at five.", "Looping in {person} for visibility.",
    "The pilot results look solid, retention is up about four points on the test group.",
    "We still need someone to own the follow-up actions from the workshop.",
    "Their procurement team asked for the security questionnaire again, I resent it this morning.",
    "Flights are booked for everyone except Omar, who is driving down from the northern office.",
    "Please remember the dress code is business casual for the client day.",
    "I spoke with {person} and we agreed to keep the scope as it is for phase one.",
    "The shuttle from the hotel leaves at 7:45, breakfast is served from 7.",
    "Notes from today's call are in the shared folder under Meetings.",
    "Could you double-check the invoice address? It should be the {city} entity.",
    "{client} want a short demo of the reporting module before they sign.",
    "The wifi at the venue was patchy, so bring the slides on a stick as a backup.",
    "Great session today, the feedback forms were very positive overall.",
    "We might need a second day for the data migration workshop, let's see how far we get.",
    "I booked a table for the team on Wednesday, details to follow.",
    "Their CTO joined for the last hour, which was a good sign.",
    "Can you forward me the contract draft so I can prepare the summary?",
    "We are still waiting on the purchase order number from their side.",
    "Parking at the office is limited, the garage across the street is the easiest option.",
    "Let's regroup on Friday to agree the next steps and owners.",
    "Reminder: timesheets for the project are due on the last working day of the month.",
    "The training materials are printed and boxed, someone needs to carry them over.",
    "I'm out on Monday but reachable by phone if anything urgent comes up.",
    "The steering committee meets on the 14th, we should have the numbers ready by then.",
    "I heard back from the hotel, late checkout is fine for the two of us.",
    "Attached are the photos of the whiteboard from the afternoon session.",
    "Nice work everyone, this was a much smoother week than the last rollout.",
    "I've updated the tracker with the open issues, three are still blocked on their IT.",
    "The taxi rank at the station was chaos, so we walked, which took twenty minutes.",
    "Their finance lead asked whether we can invoice in two instalments, I said I'd check.",
    "We'll need a separate session for the support team, they had many questions about escalation.",
    "The kickoff deck is final, version 7 in the folder.",
    "Remember to submit your expenses within the month, finance are strict about it this year.",
]
GREETINGS = ["Hi all,", "Hi {first},", "Hello everyone,", "Team,", "Hey,", "Dear {first},", "All,"]
SIGNOFFS = ["Thanks,", "Best,", "Cheers,", "Kind regards,", "Regards,", "Talk soon,"]
MONTHS = ["Sep", "Oct", "Nov"]
